"""`torpor recover`: finish the checkpoints that a crashed or killed `torpor` left (the next
`torpor checkpoint` and `torpor ls` run it too).

For each journal whose owner is gone (its owner lock is free) and whose runtime is done:
 1. committed: the checkpoint is complete (checkpoint.json in DIR, the image in the store or
    the registry) and CRIU stopped the container; only the scratch space goes;
 2. not committed: CRIU let the container run on (or it never stopped: --leave-running, or
    before the dump); what the checkpoint wrote goes, and a cgroup torpor-runc froze and left
    frozen is thawed;
 3. an older torpor-runc that stopped the container at its dump, or a complete dump whose
    container is gone (the node rebooted, its processes ended): its images are kept;
then the lease is dropped and the journal removed, all under the journal's runtime lock, after
marking it `cancelled`, so that a torpor-runc still in flight in containerd refuses it.
Checkpoints still running are left alone. Journals are on persistent storage (in the store),
so this works after a reboot too. Last, scratch directories and store versions no journal or
entry names are removed, except a scratch directory holding a complete dump: it is never
removed, but kept in <store>/kept/ and named.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

from torpor import durable
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
KEPT_DIR = "kept"   # <store>/kept/ck-<id>/: dumps that are the only copy of a workload


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
    roots = journal_roots(cfg)
    for journal in journals.journals(*roots):
        owner = journals.lock(journal.file(journals.OWNER_LOCK))
        if owner is None:
            continue  # its `torpor` is running: not ours to touch
        try:
            out.append(_recover_one(cfg, journal))
        finally:
            journals.unlock(owner)
    journals.sweep_container_locks(cfg.runtime_state_dir)
    for root in roots:
        journals.sweep_unborn(root)
    out += _orphans(cfg)
    return out


def journal_roots(cfg: Config) -> list[str]:
    """The store's journals (on persistent storage), then those an older torpor kept in the
    runtime state dir."""
    return [journals.journals_dir(cfg.image_store), journals.checkpoints_dir(cfg.runtime_state_dir)]


def _recover_one(cfg: Config, journal: Journal) -> Recovered:
    try:
        record = journal.read()
    except (OSError, TorporError):
        # it crashed while creating the journal, or the journal is damaged: the journal goes,
        # a dump in the scratch space stays (_orphans keeps every complete one)
        journal.retire()
        return Recovered(journal.id, "", "removed", "an unreadable journal, removed")
    decision = journal.decision()
    committed = decision is not None and decision.commit
    if not committed:  # its owner is gone: nobody commits it now; a late torpor-runc refuses
        with contextlib.suppress(OSError):
            journal.mark(journals.CANCELLED)
    runtime = _lock_runtime(journal, RUNTIME_WAIT_S)
    if runtime is None:
        return Recovered(record.id, record.container_id, "in progress",
                         "torpor-runc is still working on it; run `torpor recover` again")
    try:  # decided and removed under the runtime lock: no torpor-runc acts on it meanwhile
        result = _outcome(cfg, journal, record, committed)
        _drop_lease(record)
        journal.remove()
    finally:
        journals.unlock(runtime)
    return result


def _lock_runtime(journal: Journal, wait_s: float) -> int | None:
    deadline = time.monotonic() + wait_s
    while True:
        fd = journals.lock(journal.file(journals.RUNTIME_LOCK))
        if fd is not None or time.monotonic() >= deadline:
            return fd
        time.sleep(0.02)


def _outcome(cfg: Config, journal: Journal, record: CheckpointJournal,
             committed: bool) -> Recovered:
    if committed:
        if record.target.scratch:
            shutil.rmtree(record.target.scratch, ignore_errors=True)
        return Recovered(record.id, record.container_id, "complete",
                         f"complete ({record.target.describe()}); "
                         f"{record.container_id} was stopped")
    if _stopped_by_dump(journal, record):
        return Recovered(record.id, record.container_id, "kept",
                         f"{record.container_id} was stopped by its dump; the CRIU images "
                         f"are kept in {_keep(cfg, record)}")
    gone = _container_gone(journal, record)
    if gone and _dump_complete(record):
        return Recovered(record.id, record.container_id, "kept",
                         f"interrupted at step {record.step}, and {record.container_id} {gone}; "
                         f"its complete dump is kept in {_how_to_use(_keep(cfg, record))}")
    if record.step == "finished":  # it ended, but containerd was away to drop its lease
        return Recovered(record.id, record.container_id, "removed",
                         "it had ended; its containerd lease was dropped")
    _thaw_if_left_frozen(journal)
    discard_output(record.target)
    state = "was never stopped" if record.leave_running else "runs on"
    return Recovered(record.id, record.container_id, "rolled back",
                     f"interrupted at step {record.step}; {record.container_id} {state}; "
                     "what it wrote was removed")


def _dump_dir(record: CheckpointJournal) -> str | None:
    target = record.target
    directory = os.path.join(target.scratch, "checkpoint") if target.scratch else target.directory
    return directory


def _dump_complete(record: CheckpointJournal) -> bool:
    """CRIU's images are whole: the post-dump hook (or an older torpor-runc) wrote the state."""
    directory = _dump_dir(record)
    return bool(directory) and holds_dump(os.path.join(directory or "", names.CRIU_DIR))


def holds_dump(criu_dir: str) -> bool:
    """Whether CRIU's images in `criu_dir` are whole (torpor-runc's state is written once they
    are); a state that cannot be read counts as whole: in doubt, a dump is kept."""
    return os.path.exists(container_state.state_path(criu_dir))


def _container_gone(journal: Journal, record: CheckpointJournal) -> str:
    """Why the checkpointed processes are gone ("" when they may still run): the node
    rebooted since, or the container's init process is no more."""
    if record.boot_id and record.boot_id != journals.boot_id():
        return "is gone (the node rebooted since)"
    runtime = journal.runtime_record()
    if runtime is not None and runtime.init_pid > 0:
        try:
            os.kill(runtime.init_pid, 0)
        except ProcessLookupError:
            return "is gone (its processes ended)"
        except PermissionError:
            pass
    return ""


def _keep(cfg: Config, record: CheckpointJournal) -> str:
    """Where a dump that is the only copy of a workload stays: a checkpoint directory where it
    is, a scratch space moved out of the scratch area (which is swept)."""
    if not record.target.scratch:
        return record.target.directory or "?"
    return keep_scratch(cfg, record.target.scratch)


def _how_to_use(kept: str) -> str:
    """Where a kept dump is, and what it is good for."""
    for directory in (kept, os.path.join(kept, "checkpoint")):
        if os.path.exists(os.path.join(directory, names.CHECKPOINT_METADATA)):
            return f"{kept} (`torpor restore {directory}` brings the container back; remove it " \
                   "when it is not needed)"
    return f"{kept} (CRIU's images and torpor-runc's state, without checkpoint.json: for " \
           "`runc restore` or inspection; remove it when it is not needed)"


def keep_scratch(cfg: Config, scratch: str) -> str:
    kept = Store(cfg.image_store).root / KEPT_DIR
    kept.mkdir(mode=0o700, parents=True, exist_ok=True)
    destination = kept / os.path.basename(scratch)
    try:
        os.rename(scratch, destination)
    except OSError:
        return scratch  # left where it is: never removed either
    with contextlib.suppress(OSError):
        durable.sync_dir(str(kept))
        durable.sync_dir(os.path.dirname(scratch))
    return str(destination)


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


def _orphans(cfg: Config) -> list[Recovered]:
    """Checkpoint scratch directories no journal names (removed; those holding a complete
    dump, whose journal is lost or was damaged, are kept and named), and store versions no
    entry uses."""
    store = Store(cfg.image_store)
    live = {j.id for j in journals.journals(*journal_roots(cfg))}
    out = []
    for path in sorted((store.root / "scratch").glob("ck-*")):
        if path.name[3:] in live:
            continue
        if holds_dump(str(path / "checkpoint" / names.CRIU_DIR)):
            kept = keep_scratch(cfg, str(path))
            out.append(Recovered(path.name[3:], "", "kept",
                                 f"a complete dump without a journal, kept in "
                                 f"{_how_to_use(kept)}"))
            continue
        shutil.rmtree(path, ignore_errors=True)
        out.append(Recovered(path.name, "", "removed",
                             f"removed {path}, left by an unfinished operation"))
    for path_text in store.sweep():
        out.append(Recovered(os.path.basename(path_text), "", "removed",
                             f"removed {path_text}, left by an unfinished operation"))
    return out
