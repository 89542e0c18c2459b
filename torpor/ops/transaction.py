"""A checkpoint as a transaction with a journal (docs/checkpoint.md, "When a checkpoint fails").

A checkpoint that stops its container stops it last. torpor-runc freezes the container and
CRIU dumps it, then CRIU's post-dump hook (torpor.shim.post_dump) holds it while `torpor
checkpoint` writes the checkpoint (metadata, layers, push); `commit` lets CRIU stop it, and an
`abort`, or the death of this process, lets it run on as if nothing had happened. With
--leave-running it runs on after the dump anyway. Either way the workload is never lost: it
runs, or its checkpoint is complete.

The journal (torpor.capture.journal) records each step, so that `torpor recover` (run by the
next `torpor checkpoint` and `torpor ls`) can finish what a crash left: remove what an
unfinished checkpoint wrote, or keep a complete one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from torpor.capture import journal as journals
from torpor.capture.journal import Journal
from torpor.config import Config
from torpor.containerd.client import Client
from torpor.errors import CheckpointError, ContainerdError, DeadlineExceeded
from torpor.formats import state as container_state
from torpor.formats.journal import CheckpointJournal, Decision, JournalTarget
from torpor.reporting import Progress

if TYPE_CHECKING:
    from torpor.formats.state import ContainerState

SETTLE_S = 2.0   # after the runtime is done, how long containerd may take to answer
OVERRAN_SETTLE_S = 10.0  # how long an abort waits for a runtime already past its deadline


RUNTIME_SLACK_S = 30.0   # past a deadline torpor-runc keeps (its own kill, and what it undoes)


class Transaction:
    """One checkpoint in progress: its journal, the locks that say its owner lives, and the
    containerd lease that holds what it makes."""

    def __init__(self, client: Client, cfg: Config, journal: Journal, record: CheckpointJournal,
                 progress: Progress, owner: int, deciding: int) -> None:
        self.client, self.cfg, self.journal, self.record = client, cfg, journal, record
        self.progress = progress
        self.owner: int | None = owner          # held while this process lives
        self.deciding: int | None = deciding    # held until the decision is written
        self.call: _Call | None = None
        self.decided: Decision | None = None
        self.stopped_by_dump = False   # an older torpor-runc stopped it at the dump
        self.limit_s: float | None = None   # the dump's deadline (see dump)
        self._leases = contextlib.ExitStack()

    @classmethod
    def begin(cls, client: Client, cfg: Config, checkpoint_id: str, container_id: str,
              leave_running: bool, target: JournalTarget, progress: Progress) -> Transaction:
        record = CheckpointJournal(
            id=checkpoint_id, container_id=container_id, namespace=client.namespace,
            address=client.address, pid=os.getpid(), created=time.time(),
            leave_running=leave_running, target=target, boot_id=journals.boot_id())
        journal, owner, deciding = Journal.create(journals.journals_dir(cfg.image_store), record)
        return cls(client, cfg, journal, record, progress, owner, deciding)

    @property
    def two_phase(self) -> bool:
        return not self.record.leave_running

    def step(self, step: str, **changes: object) -> None:
        self.record = self.record.at(step, **changes)
        self.journal.write(self.record)
        if not journals.hold(self.cfg.runtime_state_dir, step) and not self.decided:
            raise CheckpointError(f"the test hold at {step} timed out")

    # The dump --------------------------------------------------------------------------------

    def dump(self, checkpoint: Callable[[], object], criu_dir: str,
             limit_s: float | None = None) -> None:
        """Run Tasks.Checkpoint (under a lease) until CRIU's images are complete: CRIU then
        holds the container (two-phase) or it runs on (leave-running). Past `limit_s` (longer
        than the deadline torpor-runc keeps for runc and CRIU) the dump is called off."""
        lease = self.client.create_lease()
        self._leases.enter_context(self.client.using_lease(lease))
        self.step("dumping", lease=lease)
        self.limit_s = limit_s
        deadline = time.monotonic() + limit_s if limit_s else None
        self.call = _Call(checkpoint)
        self.call.start()
        dumped = self.journal.file(journals.DUMPED)
        while not self.call.done.wait(0.01):
            if self.two_phase and os.path.exists(dumped):
                self.step("dumped")
                return
            if deadline is not None and time.monotonic() > deadline:
                later = self._runtime_deadline()
                if later is not None and later > deadline:   # torpor-runc still allows it
                    deadline = later
                    continue
                self.journal.mark(journals.CANCELLED)
                self.limit_s = OVERRAN_SETTLE_S  # the abort waits for it only that long
                raise DeadlineExceeded(
                    f"the dump (Tasks.Checkpoint: torpor-runc, runc, CRIU) did not finish "
                    f"within {limit_s:.0f}s", hint="[checkpoint] timeout_s sets the deadline")
        if self.call.error is None:
            if self.two_phase and not os.path.exists(dumped):
                self.stopped_by_dump = True  # not held: the dump is the only copy now
            self.step("dumped")
            return
        # containerd failed: restarted, or it failed after the runtime succeeded
        self.journal.mark(journals.CANCELLED)
        runtime = self.journal.file(journals.RUNTIME_LOCK)
        while journals.is_locked(runtime) and not os.path.exists(dumped):
            time.sleep(0.02)
        finished = os.path.exists(dumped) if self.two_phase else \
            container_state.read(criu_dir) is not None
        if not finished:
            raise self.call.error
        self.progress.step(f"containerd reported an error, but the dump is whole: {self.call.error}")
        self.step("dumped")

    def _runtime_deadline(self) -> float | None:
        """torpor-runc's deadline for the step it is in, plus RUNTIME_SLACK_S: it reckons
        after the GPU step has moved GPU memory into host memory, where `torpor checkpoint`
        could not, and kills what overruns it itself (journal.publish_deadline)."""
        published = self.journal.published_deadline()
        return published + RUNTIME_SLACK_S if published is not None else None

    def state(self, criu_dir: str) -> ContainerState:
        state = container_state.read(criu_dir)
        if state is None:
            raise CheckpointError(f"torpor-runc left no state in {criu_dir}: is the container's "
                                  "runtime really torpor-runc?")
        return state

    # The end ---------------------------------------------------------------------------------

    def commit(self) -> None:
        """The checkpoint is complete: CRIU may stop the container (two-phase)."""
        self._decide(Decision(True, "the checkpoint is complete"))
        self.step("committed")
        self._settle()

    def abort(self, reason: str) -> bool:
        """Call it off: CRIU lets the container run on; everything written is removed. False
        when the container was stopped by its dump (an older torpor-runc): the dump is kept."""
        self._decide(Decision(False, reason))
        self.journal.mark(journals.CANCELLED)
        self._settle()
        if self.stopped_by_dump:
            return False
        discard_output(self.record.target)
        return True

    def close(self) -> None:
        """Drop the lease (containerd collects what it held) and the journal."""
        self._leases.close()
        lease_kept = False
        if self.record.lease:
            try:
                self.client.delete_lease(self.record.lease, sync=True)
            except ContainerdError:
                lease_kept = True  # containerd is away: `torpor recover` drops it later
        if self.record.target.scratch:
            shutil.rmtree(self.record.target.scratch, ignore_errors=True)
        if lease_kept or not self.journal.retire(wait_s=SETTLE_S):
            self.step("finished")  # containerd or torpor-runc still busy: `torpor recover` ends it
        journals.unlock(self.deciding)
        journals.unlock(self.owner)

    def _decide(self, decision: Decision) -> None:
        if self.decided is not None:
            return
        self.journal.decide(decision)
        self.decided = decision
        journals.unlock(self.deciding)  # CRIU's post-dump hook reads the decision now
        self.deciding = None

    def _settle(self) -> None:
        """Wait until torpor-runc, runc and CRIU are done (and containerd has answered)."""
        if self.call is None:
            return
        runtime = self.journal.file(journals.RUNTIME_LOCK)
        free_since: float | None = None
        # a runtime past its own deadline is not waited for forever: the decision is written,
        # so CRIU can no longer stop the container, only let it run on
        give_up = time.monotonic() + self.limit_s if self.limit_s else None
        while not self.call.done.wait(0.02):
            if give_up is not None and time.monotonic() > give_up:
                return
            if journals.is_locked(runtime):
                free_since = None
            elif free_since is None:
                free_since = time.monotonic()
            elif time.monotonic() - free_since > SETTLE_S:
                return
        if self.call.error is not None and self.decided is not None and self.decided.commit:
            self.progress.step(f"containerd reported an error after the commit: {self.call.error}")


@contextlib.contextmanager
def signals_abort() -> Iterator[None]:
    """SIGTERM and SIGHUP end a checkpoint as Ctrl-C does: it aborts cleanly, at once (in the
    main thread; SIGKILL leaves the abort to CRIU's hook and `torpor recover`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Call(threading.Thread):
    """Tasks.Checkpoint in a thread: in the two-phase stop it returns only after the commit."""

    def __init__(self, function: Callable[[], object]) -> None:
        super().__init__(name="torpor-checkpoint-task", daemon=True)
        self.function = function
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.function()
        except BaseException as e:
            self.error = e
        finally:
            self.done.set()


def discard_output(target: JournalTarget) -> None:
    """Remove what an unfinished checkpoint wrote: a directory it made, the files it put in a
    directory that was empty, its scratch space."""
    if target.scratch:
        shutil.rmtree(target.scratch, ignore_errors=True)
    directory = target.directory
    if not directory or not os.path.isdir(directory):
        return
    if target.created_directory:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for entry in os.listdir(directory):
        path = os.path.join(directory, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
