"""Work done beside a frozen workload runs below it: CRIU holds the container stopped while it
dumps, so what torpor does meanwhile (cutting pages, packing them, sending packs) takes only
the CPU that CRIU leaves (docs/benchmarks.md: an upload not niced made the freeze 1.43x)."""

from __future__ import annotations

import contextlib
import os
import threading

NICE = 10   # below the process's main thread


def lower_priority() -> None:
    """This thread NICE below the process's main thread (nice is per thread on Linux, and a
    thread starts at the nice of the one that made it: a pool's threads started from a niced
    thread are not lowered twice); a thread pool's initializer, or a thread's first call."""
    me = threading.get_native_id()
    with contextlib.suppress(OSError):
        target = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + NICE)
        if os.getpriority(os.PRIO_PROCESS, me) < target:
            os.setpriority(os.PRIO_PROCESS, me, target)


def restore_priority(thread_id: int) -> None:
    """A thread lowered by lower_priority back to the main thread's nice (where allowed: root,
    or CAP_SYS_NICE; otherwise it stays where it is)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, thread_id, os.getpriority(os.PRIO_PROCESS, os.getpid()))
