"""`torpor recover`: finish the checkpoints that a crashed or killed `torpor` left (the next
`torpor checkpoint` and `torpor ls` run it too).

For each journal whose owner is gone (its owner lock is free) and whose runtime is done:
 1. committed: the checkpoint is complete (checkpoint.json in DIR, the image in the store or
    the registry) and CRIU stopped the container; only the scratch space goes;
 2. not committed: CRIU let the container run on (or it never stopped: --leave-running, or
    before the dump); what the checkpoint wrote goes, and a cgroup torpor-runc froze and left
    frozen is thawed;
 3. an older torpor-runc that stopped the container at its dump: its images are kept;
then the lease is dropped and the journal removed. Checkpoints still running are left alone.
Last, scratch directories and store versions no journal or entry names are removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from typing import Any

from torpor.capture import journal as journals
from torpor.capture.freezer import Cgroup
from torpor.capture.journal import Journal
from torpor.config import Config
from torpor.errors import TorporError
from torpor.formats import names
from torpor.formats import state as container_state
from torpor.formats.journal import CheckpointJournal
from torpor.image.store import Store
from torpor.ops.transaction import discard_output

RUNTIME_WAIT_S = 10.0


@dataclass(frozen=True)
class Recovered:
    checkpoint: str
    container: str
    outcome: str      # complete | rolled back | kept | in progress | removed
    detail: str

    def describe(self) -> str:
        return f"checkpoint {self.checkpoint} of {self.container or '?'}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def recover(cfg: Config) -> list[Recovered]:
    out = []
    for journal in journals.journals(cfg.runtime_state_dir):
        owner = journals.lock(journal.file(journals.OWNER_LOCK))
        if owner is None:
            continue  # its `torpor` is running: not ours to touch
        try:
            out.append(_recover_one(journal))
        finally:
            journals.unlock(owner)
    journals.sweep_container_locks(cfg.runtime_state_dir)
    journals.sweep_unborn(cfg.runtime_state_dir)
    for path in _orphans(cfg):
        out.append(Recovered(os.path.basename(path), "", "removed",
                             f"removed {path}, left by an unfinished operation"))
    return out


def _recover_one(journal: Journal) -> Recovered:
    try:
        record = journal.read()
    except (OSError, TorporError):
        journal.remove()  # it crashed while creating the journal: nothing else was made
        return Recovered(journal.id, "", "removed", "an empty journal, removed")
    runtime = journal.file(journals.RUNTIME_LOCK)
    if not journals.wait_unlocked(runtime, RUNTIME_WAIT_S):
        return Recovered(record.id, record.container_id, "in progress",
                         "torpor-runc is still working on it; run `torpor recover` again")
    decision = journal.decision()
    if decision is not None and decision.commit:
        if record.target.scratch:
            shutil.rmtree(record.target.scratch, ignore_errors=True)
        result = Recovered(record.id, record.container_id, "complete",
                           f"complete ({record.target.describe()}); "
                           f"{record.container_id} was stopped")
    elif _stopped_by_dump(journal, record):
        result = Recovered(record.id, record.container_id, "kept",
                           f"{record.container_id} was stopped by its dump; the CRIU images "
                           f"are kept in {record.target.scratch or record.target.directory}")
    elif record.step == "finished":  # it ended, but containerd was away to drop its lease
        result = Recovered(record.id, record.container_id, "removed",
                           "it had ended; its containerd lease was dropped")
    else:
        _thaw_if_left_frozen(journal)
        discard_output(record.target)
        state = "was never stopped" if record.leave_running else "runs on"
        result = Recovered(record.id, record.container_id, "rolled back",
                           f"interrupted at step {record.step}; {record.container_id} {state}; "
                           "what it wrote was removed")
    _drop_lease(record)
    journal.remove()
    return result


def _stopped_by_dump(journal: Journal, record: CheckpointJournal) -> bool:
    """An older torpor-runc, without the two-phase stop: its dump is the only copy."""
    if record.leave_running or journal.marked(journals.DUMPED):
        return False
    target = record.target
    directory = os.path.join(target.scratch, "checkpoint") if target.scratch else target.directory
    if not directory:
        return False
    return container_state.read(os.path.join(directory, names.CRIU_DIR)) is not None


def _thaw_if_left_frozen(journal: Journal) -> None:
    """torpor-runc's guardian thaws what it froze; should it have died too, thaw here."""
    runtime = journal.runtime_record()
    if runtime is None or not runtime.froze or not os.path.isdir(runtime.cgroup):
        return
    cgroup = Cgroup(runtime.cgroup, runtime.cgroup_version)
    with contextlib.suppress(OSError):
        if cgroup.is_frozen():
            cgroup.thaw()


def _drop_lease(record: CheckpointJournal) -> None:
    if not record.lease:
        return
    from torpor.containerd.client import Client

    with contextlib.suppress(TorporError), Client(record.address, record.namespace) as client:
        client.delete_lease(record.lease, sync=True)


def _orphans(cfg: Config) -> list[str]:
    """Checkpoint scratch directories no journal names, and store versions no entry uses."""
    store = Store(cfg.image_store)
    live = {j.id for j in journals.journals(cfg.runtime_state_dir)}
    removed = []
    for path in sorted((store.root / "scratch").glob("ck-*")):
        if path.name[3:] not in live:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed + store.sweep()
