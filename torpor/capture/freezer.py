"""The container's cgroup: its processes, and freezing and thawing it (cgroup v1 and v2).

torpor freezes a container itself, briefly, so that the files it saves (the read-write layer,
volumes, /dev/shm) match the memory CRIU dumps; CRIU keeps a frozen cgroup frozen and dumps it.
(With --leave-running, CRIU's pre-dump action freezes it the same way, in sh: shim/pre_dump.py.)
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from torpor.errors import CheckpointError
from torpor.reporting import Log

CGROUP_ROOT = "/sys/fs/cgroup"


class Cgroup:
    """The cgroup (freezer hierarchy on v1) that holds a container's init process."""

    def __init__(self, path: str, version: int) -> None:
        self.path = path
        self.version = version

    @classmethod
    def of_pid(cls, pid: int) -> Cgroup:
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                lines = f.read().splitlines()
        except OSError as e:
            raise CheckpointError(f"cannot read the cgroup of pid {pid}: {e.strerror}") from None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "freezer" in controllers.split(","):
                return cls(os.path.join(CGROUP_ROOT, "freezer", path.lstrip("/")), 1)
        for line in lines:
            hierarchy, controllers, path = line.split(":", 2)
            if hierarchy == "0" and controllers == "":
                return cls(os.path.join(CGROUP_ROOT, path.lstrip("/")), 2)
        raise CheckpointError(f"pid {pid} is in no freezer cgroup")

    def _read(self, name: str) -> str:
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def pids(self) -> list[int]:
        """Every process in the cgroup and its descendants."""
        pids: list[int] = []
        for directory, _, files in os.walk(self.path):
            if "cgroup.procs" in files:
                try:
                    with open(os.path.join(directory, "cgroup.procs")) as f:
                        pids.extend(int(p) for p in f.read().split())
                except OSError:
                    continue
        return sorted(set(pids))

    def is_frozen(self) -> bool:
        if self.version == 1:
            return self._read("freezer.state").strip() == "FROZEN"
        return "frozen 1" in self._read("cgroup.events")

    def freeze(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.version == 1:
                self._write("freezer.state", "FROZEN")
            else:
                self._write("cgroup.freeze", "1")
            if self.is_frozen():
                return
            if time.monotonic() > deadline:
                self.thaw()
                raise CheckpointError(f"the container's cgroup {self.path} did not freeze "
                                      f"within {timeout:.0f}s")
            time.sleep(0.001)

    def thaw(self) -> None:
        if self.version == 1:
            self._write("freezer.state", "THAWED")
        else:
            self._write("cgroup.freeze", "0")


@contextlib.contextmanager
def frozen(cgroup: Cgroup, log: Log) -> Iterator[bool]:
    """Freeze for the block unless already frozen (containerd paused it); yields whether we
    froze it. Thawed at the end, unless the cgroup is gone (a checkpoint stopped it)."""
    if cgroup.is_frozen():
        yield False
        return
    cgroup.freeze()
    try:
        yield True
    finally:
        thaw_unless_gone(cgroup, log)


def thaw_unless_gone(cgroup: Cgroup, log: Log) -> None:
    """Thaw what torpor froze, unless the cgroup is gone (a checkpoint stopped it); a thaw that
    fails is logged, not raised (it runs on the way out of a failure too)."""
    if os.path.isdir(cgroup.path):
        try:
            cgroup.thaw()
        except OSError as e:
            log.warning(f"could not thaw {cgroup.path}: {e}")


@contextlib.contextmanager
def thawed(cgroup: Cgroup | None) -> Iterator[None]:
    """Thaw for the block if frozen (the CUDA driver's threads must run), then freeze again."""
    was_frozen = cgroup is not None and os.path.isdir(cgroup.path) and cgroup.is_frozen()
    if was_frozen and cgroup is not None:
        cgroup.thaw()
    try:
        yield
    finally:
        if was_frozen and cgroup is not None and os.path.isdir(cgroup.path):
            cgroup.freeze()
