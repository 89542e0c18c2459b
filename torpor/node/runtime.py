"""The runc and CRIU that containerd's runtime really runs, found as the shim finds them.

containerd starts the runc shim with its own environment, and the shim runs the runtime's
BinaryName (torpor-runc; for `io.containerd.torpor.v2`, the torpor-runc beside the shim launcher
`containerd-shim-torpor-v2` on containerd's PATH). torpor-runc hands over to the runc its config
names (`[runtime] path`, searched on that PATH, TORPOR_CONFIG from that environment), and runc
runs the `criu` it finds on that PATH. So the versions a checkpoint records, and a restore is
checked against, come from containerd's environment, never the CLI's PATH: containerd's pid is
the socket's peer, its environment /proc/PID/environ; `BINARY --version` run with it answers
with the version of the runc it execs (torpor-runc passes --version through to runc), and CRIU
is the one on that PATH. Where containerd's environment cannot be read (another pid namespace,
not root), this process's own stands in.
"""

from __future__ import annotations

import os
import shutil
import socket
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from torpor import ahead
from torpor.formats.metadata import RuntimeInfo
from torpor.formats.node import NodeFacts
from torpor.handoff import peer_credentials
from torpor.node import facts

TORPOR_SHIM = "io.containerd.torpor.v2"
SHIM_LAUNCHER = "containerd-shim-torpor-v2"


@dataclass(frozen=True)
class RuntimeTools:
    """What the runtime of a container runs: paths ("" where not found) and versions."""

    runtime: str               # the binary the shim runs as runc (torpor-runc)
    runc_version: str          # "unknown" where it does not answer
    criu: str
    criu_version: str
    path: str                  # the PATH they were searched on (containerd's)
    from_containerd: bool      # containerd's own environment was read


def containerd_pid(address: str) -> int | None:
    """The pid of the process listening on containerd's socket (SO_PEERCRED)."""
    path = address.removeprefix("unix://")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(path)
            pid = peer_credentials(sock)[0]
    except OSError:
        return None
    return pid if pid > 0 else None


def containerd_environ(address: str) -> dict[str, str] | None:
    """containerd's environment (which its shims and runtimes inherit), or None."""
    pid = containerd_pid(address)
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def runtime_binary(runtime: RuntimeInfo, path: str) -> str:
    """The program the shim runs as runc for `runtime`, searched on `path`."""
    if runtime.binary_name:
        name = runtime.binary_name
    elif runtime.name == TORPOR_SHIM:
        launcher = shutil.which(SHIM_LAUNCHER, path=path)
        name = os.path.join(os.path.dirname(launcher), "torpor-runc") if launcher else ""
    else:
        name = "runc"
    if not name:
        return ""
    return name if "/" in name else shutil.which(name, path=path) or ""


def tools(address: str, runtime: RuntimeInfo) -> RuntimeTools:
    """The runc and CRIU that containerd at `address` runs for a container of `runtime`."""
    env = containerd_environ(address)
    from_containerd = env is not None
    if env is None:
        env = dict(os.environ)
    path = env.get("PATH") or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env["PATH"] = path
    env.pop("TORPOR_RUNC_LOWLEVEL", None)
    binary = runtime_binary(runtime, path)
    criu = shutil.which("criu", path=path) or ""
    with ThreadPoolExecutor(2, thread_name_prefix="torpor-versions") as both:  # one wait
        runc_asked = both.submit(facts.runc_version, binary, env) if binary else None
        criu_asked = both.submit(facts.criu_version, criu) if criu else None
        runc_version = facts.version_str(runc_asked.result()) if runc_asked else "unknown"
        criu_version = facts.version_str(criu_asked.result()) if criu_asked else "unknown"
    return RuntimeTools(binary, runc_version, criu, criu_version, path, from_containerd)


def gather(address: str, runtime: RuntimeInfo) -> NodeFacts:
    """This node's facts, with the runc and CRIU versions of the runtime containerd runs."""
    found = tools(address, runtime)
    return facts.gather(versions=(found.runc_version, found.criu_version))


def gather_ahead(address: str, runtime: RuntimeInfo) -> Future[NodeFacts]:
    """`gather` on a thread of its own, started now: the versions are asked of runc and CRIU
    (~10 ms of their start-up) while the caller goes on, and waited for where they are used."""
    return ahead.start(gather, address, runtime)
