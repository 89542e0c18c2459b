"""Facts about this node that decide whether it can run, checkpoint or restore a container.

Each fact is read the cheapest way that is still true: versions from the binaries themselves,
the cgroup version from the filesystem type of /sys/fs/cgroup, CPU features from /proc/cpuinfo.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess

from torpor.formats.node import NodeFacts

CGROUP2_SUPER_MAGIC = 0x63677270


def _run(*cmd: str, timeout: float = 20,
         env: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def parse_version(text: str) -> tuple[int, ...]:
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return ()
    return tuple(int(part) for part in match.groups(default="0"))


def version_str(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version)) if version else "unknown"


def which(name: str, extra: tuple[str, ...] = ("/usr/local/sbin", "/usr/sbin", "/sbin")) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for directory in extra:
        path = os.path.join(directory, name)
        if os.access(path, os.X_OK):
            return path
    return None


def criu_version(criu: str | None = None) -> tuple[int, ...]:
    criu = criu or which("criu")
    if not criu:
        return ()
    code, out = _run(criu, "--version")
    line = next((ln for ln in out.splitlines() if ln.startswith("Version:")), "")
    return parse_version(line) if code == 0 else ()


CRIU_LAZY_PAGES_WAITS = b"torpor: criu lazy-pages waits"   # packaging/criu/lazy-pages-wait.patch


def criu_lazy_pages_waits(criu: str) -> bool:
    """Whether `criu` is torpor's build, whose `criu lazy-pages` sleeps while the pages it
    asked for are on their way (a stock CRIU 4.2 holds a core until the last one is in)."""
    try:
        with open(criu, "rb") as binary:
            return CRIU_LAZY_PAGES_WAITS in binary.read()
    except OSError:
        return False


def runc_version(runc: str | None = None,
                 env: dict[str, str] | None = None) -> tuple[int, ...]:
    """`runc --version`; `runc` may be torpor-runc, which passes it through to its runc, run
    in `env` (the environment the shim runs it in)."""
    runc = runc or which("runc")
    if not runc:
        return ()
    code, out = _run(runc, "--version", env=env)
    return parse_version(out.splitlines()[0]) if code == 0 and out else ()


def containerd_version() -> tuple[int, ...]:
    binary = which("containerd")
    if not binary:
        return ()
    code, out = _run(binary, "--version")
    return parse_version(out.split(" ", 2)[-1]) if code == 0 else ()


def cgroup_version() -> int:
    try:
        stat = os.statvfs("/sys/fs/cgroup")
        del stat
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if fields[4] == "/sys/fs/cgroup":
                    fstype = fields[fields.index("-") + 1]
                    return 2 if fstype == "cgroup2" else 1
    except OSError:
        pass
    return 0


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return sorted(line.split(":", 1)[1].split())
    except OSError:
        pass
    return []


def nvidia_driver_version() -> str | None:
    try:
        with open("/proc/driver/nvidia/version") as f:
            text = f.read()
    except OSError:
        return None
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    return match.group(1) if match else "unknown"


def go_arch(machine: str | None = None) -> str:
    machine = machine or platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
            "s390x": "s390x"}.get(machine, machine)


def low_level_runc(runtime_path: str) -> str | None:
    """The runc that torpor-runc hands over to (`[runtime] path`: a name on PATH, or a path):
    the one whose version a checkpoint records and a restoring node is checked against."""
    return runtime_path if "/" in runtime_path else which(runtime_path)


def gather(runc: str | None = None, criu: str | None = None,
           versions: tuple[str, str] | None = None) -> NodeFacts:
    """This node's facts; `versions` (runc's, CRIU's) when they are already known
    (torpor.node.runtime: the ones containerd's runtime runs)."""
    runc_text, criu_text = versions or (version_str(runc_version(runc)),
                                        version_str(criu_version(criu)))
    return NodeFacts(
        architecture=go_arch(),
        kernel=platform.release(),
        criu_version=criu_text,
        runc_version=runc_text,
        cgroup_version=cgroup_version(),
        cpu_flags=tuple(cpu_flags()),
        nvidia_driver=nvidia_driver_version(),
    )
