"""Podman with torpor-runc, on storage of its own: every instance has its own --root, --runroot
and --tmpdir under one short temporary directory, cgroupfs, file events, and a torpor config of
its own (its state dir and image store, hence its own node key: one instance is one node).
Podman does not pass its environment to the runtime, so the instance's runtime is a two-line
launcher that sets TORPOR_CONFIG and runs torpor-runc (one launcher may serve two nodes: Podman
restores an archive only with the runtime path that checkpointed it). close() removes every
container it made, waits for conmon and the cleanups it starts, ends what is left of them by
pid, unmounts what Podman mounted under its directory and removes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .processes import wait_for

IMAGE = "localhost/torpor-test/busybox:1"


def available() -> bool:
    return shutil.which("podman") is not None


class Podman:
    def __init__(self, name: str, torpor_bin: Path, image_tar: Path, policy: str = "",
                 runtime: Path | None = None, netns: str | None = None) -> None:
        # Podman refuses a run root longer than 50 characters: a short directory of its own
        self.root = Path(tempfile.mkdtemp(prefix=f"torpor-pm-{name}-", dir="/var/tmp"))
        self.config = self.root / "torpor.toml"
        self.state_dir = self.root / "torpor-state"
        self.set_policy(policy)
        self.torpor_runc = torpor_bin / "torpor-runc"
        self.runtime = runtime or self.root / "runtime" / "torpor-runc"
        # in a network namespace of the test's (nsenter: the mount namespace stays the host's,
        # where Podman keeps its own network namespaces), Podman's bridge stays in there
        self.netns = netns
        self.base = [*(["nsenter", f"--net={netns}"] if netns else []), "podman",
                     "--root", str(self.root / "root"), "--runroot", str(self.root / "run"),
                     "--tmpdir", str(self.root / "tmp"),
                     "--storage-driver", "overlay", "--cgroup-manager", "cgroupfs",
                     "--events-backend", "file", "--runtime", str(self.runtime)]
        self("load", "-q", "-i", str(image_tar))  # an OCI archive named IMAGE

    def set_policy(self, policy: str) -> None:
        """This node's torpor config: its own state and store, then `policy` (TOML)."""
        self.config.write_text(f'[runtime]\nstate_dir = "{self.state_dir}"\n'
                               f'log_dir = "{self.state_dir}-logs"\n'
                               f'[image]\nstore = "{self.root / "store"}"\n{policy}')

    def _point_runtime(self) -> None:
        """The launcher runs torpor-runc with this instance's config. Podman restores an
        archive only with the runtime path that made it, so two nodes may share one launcher
        (`runtime`), pointed at the node that runs the next command."""
        self.runtime.parent.mkdir(parents=True, exist_ok=True)
        new = self.runtime.with_name(self.runtime.name + ".new")
        new.write_text(f"#!/bin/sh\nTORPOR_CONFIG={self.config} exec {self.torpor_runc} \"$@\"\n")
        new.chmod(0o755)
        new.rename(self.runtime)

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        self._point_runtime()
        result = subprocess.run([*self.base, *args], capture_output=True, text=True,
                                timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout}{result.stderr}")
        return result

    def run(self, name: str, command: str, *options: str) -> str:
        """A container on no network, or on Podman's default one (its bridge) in `netns`."""
        network = [] if self.netns else ["--network", "none"]
        return self("run", "-d", "--name", name, *network, "--ulimit",
                    "nofile=1024:1024", "--ulimit", "nproc=1024:1024", *options, IMAGE, "sh",
                    "-c", command).stdout.strip()

    def counter(self, name: str) -> int:
        return int(self("exec", name, "cat", "/tmp/count").stdout.strip())

    def wait_counter_above(self, name: str, value: int) -> int:
        def above() -> int | None:
            result = self("exec", name, "cat", "/tmp/count", check=False)
            text = result.stdout.strip()
            return int(text) if result.returncode == 0 and text.isdigit() and \
                int(text) > value else None

        found = wait_for(above, timeout=20, what=f"counter of {name} above {value}")
        assert isinstance(found, int)
        return found

    def state(self, name: str) -> str:
        return self("inspect", "-f", "{{.State.Status}}", name).stdout.strip()

    def names(self) -> list[str]:
        return self("ps", "-a", "--format", "{{.Names}}").stdout.split()

    def close(self) -> None:
        if not self.root.exists():
            return
        self("rm", "-f", "-a", "-t", "0", check=False)
        # conmon runs `podman container cleanup` when a container ends, after rm returned: it
        # would make the storage again; wait for them, then end what is left, by pid
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not self._processes(), timeout=10, what="conmon and its cleanup")
        for pid in self._processes():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not self._processes(), timeout=5, what="the ended processes")
        for target in sorted(self._mounts(), key=len, reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def _processes(self) -> list[int]:
        """conmon, and the Podman cleanups it starts, of this instance (their command lines
        name its directories)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if argv and os.path.basename(argv[0]) in (b"conmon", b"podman") and \
                    int(entry) != os.getpid() and any(str(self.root).encode() in a for a in argv):
                found.append(int(entry))
        return found

    def _mounts(self) -> list[str]:
        prefix = str(self.root) + "/"
        with open("/proc/self/mountinfo") as f:
            targets = [line.split()[4] for line in f]
        return [t for t in targets if t.startswith(prefix)]
