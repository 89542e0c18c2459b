"""Stopping a checkpoint cleanly: signals that unwind it, and the test hook that holds it."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING

from torpor.errors import CheckpointError

if TYPE_CHECKING:
    from torpor.shim.main import Context


class Interrupted(CheckpointError):
    pass


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP raise Interrupted, so the ExitStack undoes what was done.
    Only in this process: children forked meanwhile (pyroute2 forks one to enter the network
    namespace, and ends it with SIGTERM) inherit the handler and must just die."""
    owner = os.getpid()

    def handler(signum: int, frame: object) -> None:
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Interrupted(f"checkpoint interrupted by signal {signum}; the container keeps running")

    previous = {sig: signal.signal(sig, handler)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)



def hold(ctx: Context, step: str) -> None:
    """Test hook: stop at `step` while <state_dir>/test-hold/<step> exists (tests kill us here).
    A hold that times out interrupts the checkpoint: the container runs on."""
    from torpor.capture import journal

    if not journal.hold(ctx.cfg.runtime_state_dir, step):
        raise Interrupted(f"the test hold at {step} timed out; the container keeps running")
