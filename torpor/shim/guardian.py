"""A guardian process that undoes a checkpoint's side effects if torpor-runc dies mid-way.

An ExitStack undoes the steps when torpor-runc fails or is told to stop (SIGTERM, SIGINT). It
cannot when torpor-runc is SIGKILLed, which is how containerd ends a runtime call whose context
was cancelled. So before it freezes anything, torpor-runc forks this guardian and tells it, over
a pipe, what to undo: the cgroup it froze and the CUDA processes it locked. When torpor-runc
finishes it says `done`; if the pipe closes without that, the guardian waits for the runc child
to exit, then thaws the cgroup and restores and unlocks the GPUs.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Pending:
    """What the guardian would undo, as torpor-runc has told it so far."""

    cgroup: str = ""              # the cgroup torpor-runc froze
    cgroup_version: int = 0
    thaw: bool = False            # whether it must be thawed (torpor froze it)
    refreeze: bool = False        # whether it must be frozen again (torpor thawed it for the
                                  # GPU driver; its owner had paused it)
    runc_pid: int = 0             # runc checkpoint, which must end before anything is undone
    gpu_pids: list[int] = field(default_factory=list)   # CUDA processes locked
    gpu_worker_pid: int = 0       # the process making torpor-runc's driver calls
    gpu_worker_deadline: float = 0.0  # when its current call is given up (time.monotonic())

    def update(self, told: dict[str, Any]) -> None:
        for key, value in told.items():
            if key in self.__dataclass_fields__:
                setattr(self, key, value)


class Guardian:
    def __init__(self) -> None:
        self.pid = 0
        self._write = -1

    def start(self, undo: Callable[[Pending], None]) -> Guardian:
        """Fork the guardian; `undo(state)` runs in it if torpor-runc dies without `done`."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the guardian
            os.close(write)
            _detach_stdio()
            state = Pending()
            buffer = b""
            while True:
                chunk = os.read(read, 4096)
                if not chunk:
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line == b"done":
                        os._exit(0)
                    state.update(json.loads(line))
            _wait_gone(state.runc_pid)
            try:
                undo(state)
            finally:
                os._exit(0)
        os.close(read)
        os.set_inheritable(write, False)
        self.pid, self._write = pid, write
        return self

    def tell(self, **state: Any) -> None:
        if self._write >= 0:
            os.write(self._write, json.dumps(state).encode() + b"\n")

    def release(self) -> None:
        """Normal end: the guardian exits without undoing anything."""
        if self._write < 0:
            return
        try:
            os.write(self._write, b"done\n")
        except OSError:
            pass
        os.close(self._write)
        self._write = -1
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _detach_stdio() -> None:
    """Never hold the caller's pipes open: containerd waits for them to close."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _wait_gone(pid: int | None, timeout: float = 600.0) -> None:
    if not pid:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
