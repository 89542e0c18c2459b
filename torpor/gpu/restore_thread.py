"""Run only the CUDA driver's restore thread of a process whose other threads stay stopped.

The driver restores a process's GPU state on a thread of its own inside the process, and the
rest of the process must not run meanwhile: "The resuming process has to stay frozen during
this time otherwise attempting to access a UVM pointer will crash if we haven't restored the
underlying mappings yet" (CRIU, plugins/cuda). CRIU's plugin holds every thread under ptrace
and continues that one alone. torpor restores GPU state after CRIU has finished, with every
task left stopped (CRIU's leave-stopped, criu_config.py), and does the same: it seizes the
restore thread with ptrace (PTRACE_SEIZE on a stopped thread traps it), blocks every signal on
it but SIGTRAP (a signal meant for the process must not run the application's handler on the
driver's thread), continues it alone, and afterwards interrupts it, puts its signal mask back
and detaches it, which returns it to the group stop. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterator

from torpor.errors import GpuError

PTRACE_CONT = 7
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_GETSIGMASK = 0x420A
PTRACE_SETSIGMASK = 0x420B
WALL = 0x40000000  # __WALL: wait for threads too
WAIT_S = 10.0

_libc: ctypes.CDLL | None = None


def _ptrace(request: int, tid: int, addr: int = 0, data: int = 0) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.ptrace.restype = ctypes.c_long
        _libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if _libc.ptrace(request, tid, addr, data) == -1:
        err = ctypes.get_errno()
        raise GpuError(f"ptrace({request:#x}) of the CUDA restore thread {tid} failed: "
                       f"{os.strerror(err)}")


def thread_state(pid: int, tid: int) -> str:
    """The scheduler's letter for a thread (R, S, D, T stopped, t traced); '' when gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            text = f.read()
    except OSError:
        return ""
    return text[text.rindex(")") + 2:][:1]


def _wait_stop(tid: int, deadline: float) -> None:
    while True:
        try:
            waited, status = os.waitpid(tid, WALL | os.WNOHANG)
        except ChildProcessError:
            raise GpuError(f"the CUDA restore thread {tid} is gone") from None
        if waited == tid:
            if os.WIFSTOPPED(status):
                return
            raise GpuError(f"the CUDA restore thread {tid} ended while being restored")
        if time.monotonic() > deadline:
            raise GpuError(f"the CUDA restore thread {tid} did not stop within {WAIT_S:.0f} s")
        time.sleep(0.001)


@contextlib.contextmanager
def running_alone(pid: int, tid: int) -> Iterator[None]:
    """The block runs with thread `tid` of `pid` running and the process's other threads as
    they were (stopped, after a leave-stopped CRIU restore)."""
    stopped = thread_state(pid, tid) in ("T", "t")
    _ptrace(PTRACE_SEIZE, tid)
    try:
        if not stopped:
            _ptrace(PTRACE_INTERRUPT, tid)
        _wait_stop(tid, time.monotonic() + WAIT_S)
        saved = ctypes.c_uint64()
        _ptrace(PTRACE_GETSIGMASK, tid, 8, ctypes.addressof(saved))
        blocked = ctypes.c_uint64(~(1 << (signal.SIGTRAP - 1)) & (2**64 - 1))
        _ptrace(PTRACE_SETSIGMASK, tid, 8, ctypes.addressof(blocked))
        _ptrace(PTRACE_CONT, tid)
        try:
            yield
        finally:
            _ptrace(PTRACE_INTERRUPT, tid)
            _wait_stop(tid, time.monotonic() + WAIT_S)
            _ptrace(PTRACE_SETSIGMASK, tid, 8, ctypes.addressof(saved))
    finally:
        with contextlib.suppress(GpuError):
            _ptrace(PTRACE_DETACH, tid)


def continue_processes(pids: list[int]) -> None:
    """SIGCONT: the processes a leave-stopped restore left stopped run again."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
