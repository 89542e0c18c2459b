"""The pure pieces behind "never lose a workload": the journal's formats and locks, per-bundle
record keys, the store's atomic switch, and torpor-runc's own queries of runc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torpor.capture import journal as journals
from torpor.capture import records
from torpor.capture.journal import ContainerLock, Journal
from torpor.errors import CheckpointError, FormatError
from torpor.formats.journal import CheckpointJournal, Decision, JournalTarget, RuntimeRecord
from torpor.image.store import Store
from torpor.shim.argv import Invocation
from torpor.shim.runc import query_args

RECORD = CheckpointJournal(id="20260101-000000-abcd", container_id="web1", namespace="default",
                           address="/run/containerd/containerd.sock", pid=42, created=1.5,
                           leave_running=False,
                           target=JournalTarget(directory="/ck", created_directory=True))


def test_journal_formats_round_trip_and_refuse_others() -> None:
    assert CheckpointJournal.loads(RECORD.dumps(), "j") == RECORD
    moved = RECORD.at("compressing", lease="torpor-1")
    assert CheckpointJournal.loads(moved.dumps(), "j") == moved
    assert Decision.loads(Decision(False, "disk full").dumps(), "d") == Decision(False, "disk full")
    runtime = RuntimeRecord(pid=1, init_pid=2, cgroup="/sys/fs/cgroup/freezer/x", cgroup_version=1,
                            froze=True)
    assert RuntimeRecord.loads(runtime.dumps(), "r") == runtime
    with pytest.raises(ValueError):
        RECORD.at("teleported")
    with pytest.raises(FormatError, match="step 'teleported' is none of"):
        CheckpointJournal.loads(RECORD.dumps().replace(b'"started"', b'"teleported"'), "j")
    with pytest.raises(FormatError, match="this torpor reads"):
        Decision.loads(RuntimeRecord(1, 2, "c", 2, False).dumps(), "d")


def test_a_journal_appears_whole_and_is_found_from_its_work_path(tmp_path: Path) -> None:
    journal, owner, deciding = Journal.create(str(tmp_path), RECORD)
    assert journals.journals(str(tmp_path))[0].path == journal.path
    assert journals.is_locked(journal.file(journals.OWNER_LOCK))
    assert journal.read() == RECORD
    found = Journal.of_work_path([str(tmp_path)], journal.work_dir)
    assert found is not None and found.path == journal.path
    assert Journal.of_work_path([str(tmp_path)], str(tmp_path / "x" / "elsewhere" / "work")) is None
    assert Journal.of_work_path([str(tmp_path)], None) is None
    with pytest.raises(CheckpointError, match="called off"):
        Journal.of_work_path([str(tmp_path)], str(tmp_path / "gone" / "work"))
    # a journal of a `torpor` configured with another store is still one, gone or not
    with pytest.raises(CheckpointError, match="called off"):
        Journal.of_work_path(["/elsewhere"], str(tmp_path / "journals" / "20260101-000000-abcd1234" / "work"))
    assert Journal.of_work_path(["/elsewhere"], str(tmp_path / "journals" / "x" / "work")) is None
    assert journal.decision() is None
    journal.decide(Decision(True, "complete"))
    assert journal.decision() == Decision(True, "complete")
    journals.unlock(deciding)
    journals.unlock(owner)
    assert not journals.is_locked(journal.file(journals.OWNER_LOCK))


def test_a_second_checkpoint_of_a_container_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = ContainerLock.acquire(str(tmp_path), "/run/c.sock", "ns", "web1", "by torpor pid 7")
    other = ContainerLock.acquire(str(tmp_path), "/run/c.sock", "ns", "web2", "by torpor pid 8")
    with pytest.raises(CheckpointError, match=r"web1 is already being checkpointed \(by torpor "
                                              r"pid 7\)"):
        ContainerLock.acquire(str(tmp_path), "/run/c.sock", "ns", "web1", "by torpor pid 9")
    first.release()
    again = ContainerLock.acquire(str(tmp_path), "/run/c.sock", "ns", "web1", "pid 9")
    assert journals.sweep_container_locks(str(tmp_path)) == []  # both held
    again.release()
    os.close(other.fd)  # its holder died without releasing it: the lock file is swept
    other.fd = -1
    assert len(journals.sweep_container_locks(str(tmp_path))) == 1


def test_records_of_two_containerds_never_meet() -> None:
    one = records.record_dir("/run/torpor", "/run/containerd/io.containerd.runtime.v2.task/k8s.io/web",
                             "web")
    two = records.record_dir("/run/torpor", "/run/k3s/io.containerd.runtime.v2.task/k8s.io/web",
                             "web")
    assert one != two
    assert os.path.dirname(one) == os.path.dirname(two) == "/run/torpor/containers/k8s.io"
    assert os.path.basename(records.record_dir("/s", "/elsewhere/bundle", "c1")).startswith("c1.")


@pytest.mark.parametrize(("argv", "query"), [
    (["runc", "--root", "/r", "--log", "/b/log.json", "--log-format", "json", "checkpoint", "c"],
     ["--root", "/r"]),
    (["runc", "--log=/l", "--debug", "--log-format=text", "checkpoint", "c"], ["--debug"]),
])
def test_queries_leave_the_callers_log_alone(argv: list[str], query: list[str]) -> None:
    assert query_args(Invocation(argv)) == query


def _layout(path: Path, text: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "index.json").write_text(text)


def test_the_store_switches_whole_layouts_and_keeps_the_old_one_on_failure(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    with store.staging("r/one:1") as staged:
        _layout(staged, '{"manifests": [{"digest": "sha256:aa"}]}')
    assert store.has("r/one:1")
    with pytest.raises(RuntimeError), store.staging("r/one:1") as staged:
        _layout(staged, "half")
        raise RuntimeError("the download failed")
    assert [e.digest for e in store.entries()] == ["sha256:aa"]
    built = tmp_path / "store" / "scratch" / "ck-1" / "layout"
    _layout(built, '{"manifests": [{"digest": "sha256:bb"}]}')
    store.install("r/one:1", built)
    assert [e.digest for e in store.entries()] == ["sha256:bb"]
    versions = list((store.layout("r/one:1").parent / "versions").iterdir())
    assert len(versions) == 1 and store.sweep() == []
    with pytest.raises(RuntimeError), store.staging("r/new:1"):
        raise RuntimeError("first pull failed")
    assert not store.has("r/new:1") and len(list((tmp_path / "store" / "images").iterdir())) == 1
