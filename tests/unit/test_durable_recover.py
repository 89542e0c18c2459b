"""A dump that may be the only copy of a workload is never removed by `torpor recover`: not when
its journal is gone or damaged, not after a reboot; journals live on persistent storage, older
ones in the runtime state dir are still recovered; and torpor.durable syncs whole trees."""

from __future__ import annotations

import os
from pathlib import Path

from torpor import durable
from torpor.capture import journal as journals
from torpor.capture.journal import Journal
from torpor.config import Config
from torpor.formats import state as container_state
from torpor.formats.journal import CheckpointJournal, JournalTarget
from torpor.ops import recover

from .samples import STATE


def config(tmp_path: Path) -> Config:
    return Config({"image": {"store": str(tmp_path / "store")},
                   "runtime": {"state_dir": str(tmp_path / "state")}})


def a_dump(scratch: Path) -> Path:
    """A scratch space as a checkpoint leaves it once CRIU's images are complete."""
    criu = scratch / "checkpoint" / "criu"
    criu.mkdir(parents=True)
    (criu / "pages-1.img").write_bytes(b"\1" * 8192)
    container_state.write(str(criu), STATE)
    return criu


def record(tmp_path: Path, checkpoint_id: str, **changes: object) -> CheckpointJournal:
    scratch = tmp_path / "store" / "scratch" / f"ck-{checkpoint_id}"
    base = CheckpointJournal(
        id=checkpoint_id, container_id="web1", namespace="default", address="/nowhere.sock",
        pid=1, created=1.0, leave_running=False, step="compressing",
        target=JournalTarget(ref="localhost/x:1", store=str(tmp_path / "store"),
                             scratch=str(scratch)), boot_id=journals.boot_id())
    step = str(changes.pop("step", base.step))
    return base.at(step, **changes)


def test_a_complete_dump_whose_journal_is_gone_is_kept_and_named(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    scratch = tmp_path / "store" / "scratch" / "ck-20260101-000000-dead"
    a_dump(scratch)
    half = tmp_path / "store" / "scratch" / "ck-20260101-000000-half"
    (half / "checkpoint" / "criu").mkdir(parents=True)   # CRIU never finished: no state
    done = recover.recover(cfg)
    kept = tmp_path / "store" / "kept" / scratch.name
    assert [(d.outcome, d.checkpoint) for d in done if d.outcome == "kept"] == \
        [("kept", "20260101-000000-dead")]
    assert str(kept) in next(d.detail for d in done if d.outcome == "kept")
    assert container_state.read(str(kept / "checkpoint" / "criu")) == STATE
    assert not half.exists()
    assert recover.recover(cfg) == []   # named once; it stays where it was put


def test_a_complete_dump_whose_journal_is_damaged_is_kept(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    rec = record(tmp_path, "20260101-000000-bad1")
    journal, owner, deciding = Journal.create(journals.journals_dir(cfg.image_store), rec)
    a_dump(Path(rec.target.scratch or ""))
    Path(journal.file("journal.json")).write_bytes(b"{\0 damaged")
    journals.unlock(deciding)
    journals.unlock(owner)
    done = recover.recover(cfg)
    assert sorted(d.outcome for d in done) == ["kept", "removed"], done
    assert (tmp_path / "store" / "kept" / "ck-20260101-000000-bad1" / "checkpoint").is_dir()
    assert not Path(journal.path).exists()


def test_after_a_reboot_an_uncommitted_complete_dump_is_kept(tmp_path: Path) -> None:
    """The journal is in the store, so it outlives /run; the container died with the boot."""
    cfg = config(tmp_path)
    rec = record(tmp_path, "20260101-000000-boot", boot_id="another-boot")
    journal, owner, deciding = Journal.create(journals.journals_dir(cfg.image_store), rec)
    a_dump(Path(rec.target.scratch or ""))
    journal.mark(journals.DUMPED)
    journals.unlock(deciding)
    journals.unlock(owner)
    done = recover.recover(cfg)
    assert [d.outcome for d in done] == ["kept"], done
    assert "rebooted" in done[0].detail
    assert (tmp_path / "store" / "kept" / "ck-20260101-000000-boot" / "checkpoint" / "criu").is_dir()
    assert journals.journals(*recover.journal_roots(cfg)) == []


def test_a_journal_an_older_torpor_left_in_the_state_dir_is_recovered(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    rec = record(tmp_path, "20260101-000000-old1", step="requested")
    journal, owner, deciding = Journal.create(journals.checkpoints_dir(cfg.runtime_state_dir), rec)
    journals.unlock(deciding)
    journals.unlock(owner)
    done = recover.recover(cfg)
    assert [d.outcome for d in done] == ["rolled back"], done
    assert not Path(journal.path).exists()


def test_a_journal_is_retired_only_under_its_runtime_lock(tmp_path: Path) -> None:
    """A torpor-runc that holds the lock keeps its journal; one that comes after is refused."""
    rec = record(tmp_path, "20260101-000000-lock")
    journal, owner, deciding = Journal.create(str(tmp_path / "j"), rec)
    runtime = journal.lock_runtime()
    assert not journal.retire()
    assert journal.marked(journals.CANCELLED) and Path(journal.path).exists()
    journals.unlock(runtime)
    assert journal.retire()
    assert not Path(journal.path).exists()
    journals.unlock(deciding)
    journals.unlock(owner)


def test_sync_tree_syncs_every_file_and_directory(tmp_path: Path) -> None:
    (tmp_path / "ck" / "criu").mkdir(parents=True)
    for i in range(5):
        (tmp_path / "ck" / "criu" / f"core-{i}.img").write_bytes(os.urandom(100))
    (tmp_path / "ck" / "checkpoint.json").write_bytes(b"{}")
    os.symlink("criu", tmp_path / "ck" / "link")
    synced = durable.sync_tree(str(tmp_path / "ck"))
    assert (synced.files, synced.directories, synced.bytes) == (6, 2, 502)
    assert durable.syncfs(str(tmp_path)) >= 0


def test_runc_holds_the_journals_runtime_lock_for_as_long_as_it_lives(tmp_path: Path) -> None:
    """torpor-runc and its guardian may die before the guardian hears of runc: the lock is runc's
    too, so nobody removes the journal (and CRIU's configuration in it) while runc runs."""
    from torpor.shim.argv import Invocation
    from torpor.shim.checkpoint_cmd import run_runc
    from torpor.shim.guardian import Guardian
    from torpor.shim.main import Context

    rec = record(tmp_path, "20260101-000000-runc")
    journal, owner, deciding = Journal.create(str(tmp_path / "j"), rec)
    runtime = journal.lock_runtime()
    assert runtime is not None
    fake_runc = tmp_path / "runc"
    # runc's stand-in: is the lock among its open files?
    fake_runc.write_text("#!/bin/sh\nls -l /proc/$$/fd | grep -q runtime.lock && echo held\n")
    fake_runc.chmod(0o755)
    ctx = Context(Invocation(["torpor-runc", "checkpoint", "c1"]), str(fake_runc), config(tmp_path))
    ran = run_runc(ctx, ["torpor-runc", "checkpoint", "c1"], Guardian(), hold_fd=runtime)
    assert ran.code == 0 and ran.output == b"held\n"
    assert not os.get_inheritable(runtime)
    journals.unlock(runtime)
    journals.unlock(deciding)
    journals.unlock(owner)
