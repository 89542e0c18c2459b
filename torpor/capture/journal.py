"""Per-checkpoint journal directories in the local store: what one `torpor checkpoint` asked,
how far it got, and who is still working on it. Nothing here is shared between two checkpoints,
of one container or of two. They live on persistent storage, beside the scratch space that
holds the dumps they speak for, so that after a power loss or a reboot `torpor recover` still
knows which dump was committed and which is the only copy of a workload; every file in them is
written durably (torpor.atomicfile, torpor.durable). Journals that an older torpor left under
<state_dir>/checkpoints/ are still found and recovered.

    <store>/journals/<id>/               0700; removed when the checkpoint ends, or by a recovery
        journal.json          the CLI's record: container, target, step reached
        request.json          what torpor-runc is asked to do (formats.request)
        owner.lock            flock held by the `torpor` that runs the checkpoint, while it lives
        decision.lock         flock held by that `torpor` until it has decided
        decision.json         commit or abort, read by CRIU's post-dump hook (shim.post_dump)
        runtime.lock          flock held by torpor-runc and its guardian while they work
        runtime.json          the cgroup torpor-runc froze
        cancelled             the CLI gave up before torpor-runc began: torpor-runc refuses
        state.pending.json    torpor-runc's state.json, put in place once CRIU has dumped
        dumped                written by the post-dump hook: CRIU's images are complete
        criu.conf, post-dump  CRIU's configuration and action script for the two-phase stop
        work/                 CRIU's work directory (dump.log)
    <state_dir>/checkpoints/locks/<key>.lock
        held by the `torpor` checkpointing one container (containerd address, namespace, id)

flock locks vanish with their holder, SIGKILL included (and with a reboot), so "is the owner
alive" is never a guess from a pid. A journal is removed only by whoever holds its runtime lock
after marking it `cancelled` (Journal.retire): a torpor-runc that containerd starts late, after
its `torpor` died, takes that lock, finds the mark or no journal, and refuses, so it can never
run CRIU with a hook whose files vanish under it (CRIU ignores a missing CRIU_CONFIG_FILE and
would then stop the container at its dump).

Stdlib and torpor.formats only: torpor-runc and CRIU's hook import it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import time
from typing import TYPE_CHECKING

from torpor.atomicfile import write_atomic
from torpor.durable import sync_dir
from torpor.errors import CheckpointError, FormatError
from torpor.formats import names
from torpor.formats.journal import CheckpointJournal, Decision, RuntimeRecord

if TYPE_CHECKING:
    from torpor.formats.request import CheckpointRequest

OWNER_LOCK = "owner.lock"
DECISION_LOCK = "decision.lock"
RUNTIME_LOCK = "runtime.lock"
CANCELLED = "cancelled"
DUMPED = "dumped"
RUNTIME_DEADLINE = "runtime-deadline"
WORK_DIR = "work"
JOURNALS_DIR = "journals"


def checkpoints_dir(state_dir: str) -> str:
    """Where the container locks are, and where an older torpor kept its journals."""
    return os.path.join(state_dir, names.CHECKPOINTS_DIR)


def journals_dir(store: str) -> str:
    """Where the journals are: in the local store, on persistent storage."""
    return os.path.join(store, JOURNALS_DIR)


def boot_id() -> str:
    """This boot's id: a journal of another boot speaks for processes that are gone."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


_JOURNAL_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{8}")


def new_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


class Journal:
    """One checkpoint's journal directory."""

    def __init__(self, path: str) -> None:
        self.path = path

    @property
    def id(self) -> str:
        return os.path.basename(self.path)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def work_dir(self) -> str:
        return self.file(WORK_DIR)

    @classmethod
    def create(cls, root: str, record: CheckpointJournal) -> tuple[Journal, int, int]:
        """The new journal in `root`, with its owner and decision locks held (their fds): it
        appears under its name, renamed in, only once they are, so no recovery takes it for
        dead."""
        os.makedirs(root, mode=0o700, exist_ok=True)
        building = cls(os.path.join(root, f".{record.id}.new"))
        os.mkdir(building.path, 0o700)
        try:
            os.mkdir(building.work_dir, 0o700)
            owner = lock(building.file(OWNER_LOCK))
            deciding = lock(building.file(DECISION_LOCK))
            assert owner is not None and deciding is not None
            building.write(record)
            journal = cls(os.path.join(root, record.id))
            sync_dir(building.path)
            os.rename(building.path, journal.path)
            sync_dir(root)
        except BaseException:
            shutil.rmtree(building.path, ignore_errors=True)
            raise
        return journal, owner, deciding

    @classmethod
    def of_work_path(cls, roots: list[str], work_path: str | None) -> Journal | None:
        """The journal whose work directory torpor-runc was given, if it is one in one of
        `roots`; CheckpointError when it names a journal that is gone (its checkpoint was
        called off: doing it anyway would stop the container with nobody to finish it)."""
        if not work_path:
            return None
        work = os.path.abspath(work_path)
        parent = os.path.dirname(work)
        if os.path.basename(work) != WORK_DIR:
            return None
        # the roots configured here, or any journal's shape: a `torpor` whose configuration
        # names another store must still get the two-phase stop, never a plain dump
        if os.path.dirname(parent) not in {os.path.abspath(r) for r in roots} and not (
                os.path.basename(os.path.dirname(parent)) in (JOURNALS_DIR, names.CHECKPOINTS_DIR)
                and _JOURNAL_ID.fullmatch(os.path.basename(parent))):
            return None
        journal = cls(parent)
        journal.check_live()
        return journal

    def check_live(self) -> None:
        """CheckpointError unless the journal is there and not called off."""
        if not os.path.isfile(self.file(names.JOURNAL)) or self.marked(CANCELLED):
            raise CheckpointError(f"checkpoint {self.id} was called off by the torpor that "
                                  "asked for it; the container was not touched")

    def lock_runtime(self, wait: bool = True) -> int | None:
        """torpor-runc's lock on this journal (its fd), once nobody removes it; CheckpointError
        when the journal was called off (removed, or marked) meanwhile."""
        try:
            fd = lock(self.file(RUNTIME_LOCK), wait=wait)
        except FileNotFoundError:  # removed while we came
            fd = None
            wait = True
        if fd is None and wait:
            raise CheckpointError(f"checkpoint {self.id} was called off by the torpor that "
                                  "asked for it; the container was not touched")
        if fd is not None:
            try:
                self.check_live()
            except CheckpointError:
                unlock(fd)
                raise
        return fd

    # The files ----------------------------------------------------------------------------------

    def read(self) -> CheckpointJournal:
        return CheckpointJournal.loads(_read(self.file(names.JOURNAL)), self.file(names.JOURNAL))

    def write(self, record: CheckpointJournal) -> None:
        write_atomic(self.file(names.JOURNAL), record.dumps(), mode=0o600)

    def write_request(self, request: CheckpointRequest) -> None:
        write_atomic(self.file(names.CHECKPOINT_REQUEST), request.dumps(), mode=0o600)

    def read_request(self) -> CheckpointRequest:
        from torpor.formats.request import CheckpointRequest

        path = self.file(names.CHECKPOINT_REQUEST)
        return CheckpointRequest.loads(_read(path), path)

    def decide(self, decision: Decision) -> None:
        write_atomic(self.file(names.DECISION), decision.dumps(), mode=0o600)

    def decision(self) -> Decision | None:
        path = self.file(names.DECISION)
        try:
            return Decision.loads(_read(path), path)
        except (FileNotFoundError, FormatError):
            return None

    def write_runtime_record(self, record: RuntimeRecord) -> None:
        write_atomic(self.file(names.RUNTIME_RECORD), record.dumps(), mode=0o600)

    def runtime_record(self) -> RuntimeRecord | None:
        path = self.file(names.RUNTIME_RECORD)
        try:
            return RuntimeRecord.loads(_read(path), path)
        except (FileNotFoundError, FormatError):
            return None

    def publish_deadline(self, deadline: float) -> None:
        """torpor-runc: its step now under way (a GPU driver call; runc and CRIU) may last until
        `deadline`, on CLOCK_MONOTONIC (one clock for every process of this boot). The
        `torpor checkpoint` waiting for Tasks.Checkpoint reckoned its own deadline before it
        knew what the step would hold (a GPU's memory moved into host memory); it follows this
        one (ops/transaction.py)."""
        write_atomic(self.file(RUNTIME_DEADLINE), f"{deadline:.3f}".encode(), mode=0o600,
                     durable=False)

    def published_deadline(self) -> float | None:
        try:
            value = float(_read(self.file(RUNTIME_DEADLINE)).decode())
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        return value if value == value and value < float("inf") else None   # not NaN, finite

    def mark(self, name: str, text: str = "") -> None:
        write_atomic(self.file(name), text.encode(), mode=0o600)

    def marked(self, name: str) -> bool:
        return os.path.exists(self.file(name))

    def retire(self, wait_s: float = 0.0) -> bool:
        """Call the checkpoint off for good and remove the journal: mark it `cancelled`, then
        take the runtime lock (waiting up to `wait_s`) and remove it while holding that lock.
        False, journal kept, when torpor-runc still holds the lock: it is working on it."""
        with contextlib.suppress(FileNotFoundError):
            self.mark(CANCELLED)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fd = lock(self.file(RUNTIME_LOCK))
            except FileNotFoundError:
                fd = -1  # the journal is gone already
            if fd is not None:
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        try:
            self.remove()
        finally:
            if fd >= 0:
                unlock(fd)
        return True

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            sync_dir(os.path.dirname(self.path))


def journals(*roots: str) -> list[Journal]:
    """Every checkpoint journal in `roots` (the store's, and the older state dir's), oldest
    first."""
    found = []
    for root in roots:
        try:
            entries = os.listdir(root)
        except FileNotFoundError:
            continue
        found += [Journal(os.path.join(root, e)) for e in entries
                  if e != names.CHECKPOINT_LOCKS_DIR and not e.startswith(".")
                  and os.path.isdir(os.path.join(root, e))]
    return sorted(found, key=lambda j: j.id)


def sweep_unborn(root: str, older_than_s: float = 60.0) -> list[str]:
    """Remove journals a crash left half-made (never renamed in)."""
    try:
        entries = [e for e in os.listdir(root) if e.startswith(".") and e.endswith(".new")]
    except FileNotFoundError:
        return []
    removed = []
    for entry in entries:
        path = os.path.join(root, entry)
        try:
            young = time.time() - os.stat(path).st_mtime < older_than_s
        except FileNotFoundError:
            continue
        if not young and not is_locked(os.path.join(path, OWNER_LOCK)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


# Locks ----------------------------------------------------------------------------------------

def lock(path: str, wait: bool = False) -> int | None:
    """An exclusive flock on `path` (created 0600); its fd, or None when someone holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def unlock(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def is_locked(path: str) -> bool:
    """Whether someone holds `path`'s lock (a missing file is not locked)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def wait_unlocked(path: str, timeout: float, poll: float = 0.02) -> bool:
    """Wait until nobody holds `path`'s lock; False if someone still does after `timeout`."""
    deadline = time.monotonic() + timeout
    while is_locked(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


class ContainerLock:
    """Held by the one `torpor checkpoint` of a container; a second one is refused, naming it."""

    def __init__(self, path: str, fd: int) -> None:
        self.path, self.fd = path, fd

    @classmethod
    def acquire(cls, state_dir: str, address: str, namespace: str, container_id: str,
                holder: str) -> ContainerLock:
        root = os.path.join(checkpoints_dir(state_dir), names.CHECKPOINT_LOCKS_DIR)
        os.makedirs(root, mode=0o700, exist_ok=True)
        key = hashlib.sha256(f"{os.path.realpath(address)}\0{namespace}\0{container_id}"
                             .encode()).hexdigest()[:24]
        path = os.path.join(root, f"{key}.lock")
        while True:
            fd = lock(path)
            if fd is None:
                try:
                    busy = _read(path).decode(errors="replace").strip()
                except OSError:
                    busy = ""
                raise CheckpointError(
                    f"container {container_id} is already being checkpointed"
                    + (f" ({busy})" if busy else ""),
                    hint="wait for that checkpoint to end, then try again")
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a file its last holder unlinked while we opened it
                os.ftruncate(fd, 0)
                os.write(fd, holder.encode())
                return cls(path, fd)
            os.close(fd)

    def release(self) -> None:
        if self.fd >= 0:
            try:
                os.unlink(self.path)  # before unlocking: a waiter never locks a dead file
            except FileNotFoundError:
                pass
            unlock(self.fd)
            self.fd = -1


def sweep_container_locks(state_dir: str) -> list[str]:
    """Remove the container locks that nobody holds (their `torpor` was killed)."""
    root = os.path.join(checkpoints_dir(state_dir), names.CHECKPOINT_LOCKS_DIR)
    try:
        entries = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    removed = []
    for entry in entries:
        path = os.path.join(root, entry)
        fd = lock(path)
        if fd is None:
            continue
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                os.unlink(path)
                removed.append(path)
        except FileNotFoundError:
            pass
        finally:
            unlock(fd)
    return removed


def hold(state_dir: str, step: str) -> bool:
    """Test hook: stop at `step` while <state_dir>/test-hold/<step> exists (tests act here:
    kill, fill a disk, restart containerd). Costs one stat when unused. The marker may hold
    its timeout in seconds (default 120). False when it timed out: the caller then gives up
    (aborts, lets the container run on), never goes on as if someone had let it go."""
    marker = os.path.join(state_dir, "test-hold", step)
    if not os.path.exists(marker):
        return True
    write_atomic(marker + ".pid", str(os.getpid()).encode(), mode=0o600)
    deadline = time.monotonic() + hold_timeout(marker)
    while os.path.exists(marker):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def hold_timeout(marker: str) -> float:
    try:
        return float(_read(marker).strip() or 120)
    except (OSError, ValueError):
        return 120.0


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
