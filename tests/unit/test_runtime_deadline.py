"""torpor-runc publishes the deadline of the step it is in (a GPU driver call, runc and CRIU)
in the checkpoint's journal, and the `torpor checkpoint` waiting on Tasks.Checkpoint follows
it where it is later than its own: the caller reckoned its deadline from the container's host
memory before the GPU step moved GPU memory into it, and would call off a dump torpor-runc
still allows (the workload ran on, the checkpoint failed)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from torpor.capture.journal import RUNTIME_DEADLINE, Journal
from torpor.ops.transaction import RUNTIME_SLACK_S, Transaction


def journal(tmp_path: Path) -> Journal:
    (tmp_path / "j").mkdir()
    return Journal(str(tmp_path / "j"))


def test_a_published_deadline_reads_back_on_the_shared_clock(tmp_path: Path) -> None:
    j = journal(tmp_path)
    assert j.published_deadline() is None
    at = time.monotonic() + 600.25
    j.publish_deadline(at)
    assert j.published_deadline() == pytest.approx(at, abs=0.001)
    assert (tmp_path / "j" / RUNTIME_DEADLINE).stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("text", ["", "soon", "nan", "inf", "1e999", "\xff"])
def test_a_deadline_that_is_no_time_is_none(text: str, tmp_path: Path) -> None:
    j = journal(tmp_path)
    (tmp_path / "j" / RUNTIME_DEADLINE).write_bytes(text.encode("latin-1"))
    assert j.published_deadline() is None


def test_the_caller_waits_for_torpor_runcs_deadline_and_its_slack(tmp_path: Path) -> None:
    txn = Transaction.__new__(Transaction)
    txn.journal = journal(tmp_path)
    assert txn._runtime_deadline() is None
    at = time.monotonic() + 900
    txn.journal.publish_deadline(at)
    assert txn._runtime_deadline() == pytest.approx(at + RUNTIME_SLACK_S, abs=0.001)
