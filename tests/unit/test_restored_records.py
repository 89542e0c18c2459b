"""torpor-runc's records of the containers it restored at create (what `torpor kube restored`
reads before a migration lets the original go): one per container, a day's kept."""

from __future__ import annotations

import os
import time
from pathlib import Path

from torpor.formats import names
from torpor.shim.create_cmd import RECORD_KEEP_S, record


def test_a_restore_is_recorded_and_old_records_go(tmp_path: Path) -> None:
    records = tmp_path / names.RESTORED_RECORDS
    records.mkdir()
    old = records / "k8s.io-gone"
    old.write_text("x\n")
    past = time.time() - RECORD_KEEP_S - 60
    os.utime(old, (past, past))
    recent = records / "k8s.io-recent"
    recent.write_text("y\n")
    record(str(tmp_path), "k8s.io", "c1", "reg/ns/pod/c:T@sha256:ab")
    assert (records / "k8s.io-c1").read_text() == "reg/ns/pod/c:T@sha256:ab\n"
    assert sorted(p.name for p in records.iterdir()) == ["k8s.io-c1", "k8s.io-recent"]


def test_a_record_that_cannot_be_written_fails_nothing(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    record(str(blocked), "k8s.io", "c1", "ref")    # its state dir is a file: no record
