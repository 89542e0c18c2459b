"""torpor.capture.deadlines: what overstays its deadline is killed whole, and only it."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from torpor.capture import deadlines
from torpor.errors import DeadlineExceeded
from torpor.shim import criu_log

T = TypeVar("T")


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def until(condition: Callable[[], T], timeout: float = 5) -> T:
    """What `condition()` gives once it is true, polled every 10 ms (no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return value


def tree(script: str) -> subprocess.Popen[bytes]:
    """A child that starts grandchildren (as runc starts CRIU, which starts its scripts)."""
    return subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_a_budget_grows_with_what_the_step_handles() -> None:
    assert deadlines.budget(300) == 300
    assert deadlines.budget(300, 4 << 30) == 300 + 4 * deadlines.PER_GIB_S
    assert deadlines.budget(300, -1) == 300


def test_a_program_within_its_deadline_is_waited_for() -> None:
    proc = tree("echo out; echo err >&2")
    assert deadlines.wait(proc, 10, output=True) == (b"out\n", b"err\n")
    assert proc.returncode == 0


def test_a_program_past_its_deadline_is_killed_with_everything_it_started() -> None:
    proc = tree("sleep 60 & sh -c 'sleep 60 & wait' & wait")
    below = until(lambda: (found := deadlines.descendants(proc.pid)) and len(found) >= 3
                  and found)
    bystander = subprocess.Popen(["sleep", "60"])  # not below it: never touched
    try:
        started = time.monotonic()
        assert deadlines.wait(proc, 0.1, output=True) is None
        assert time.monotonic() - started < 5
        until(lambda: not [p for p in [proc.pid, *below] if alive(p)])
        assert alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait()


def test_the_clock_stands_while_someone_else_holds_the_program() -> None:
    proc = tree("sleep 0.25")   # past its 0.15 s, but the clock stood for 0.2
    held_until = time.monotonic() + 0.2
    assert deadlines.wait(proc, 0.15, held=lambda: time.monotonic() < held_until) is not None
    assert proc.returncode == 0


def test_a_step_in_this_process_is_broken_off_at_its_deadline(tmp_path: Path) -> None:
    fifo = tmp_path / "blob"
    os.mkfifo(fifo)  # a FIFO where a file should be: open() blocks for ever
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="unpacking the CRIU images did not finish within"), \
            deadlines.step("unpacking the CRIU images", 0.1, "[restore] timeout_s"), \
            open(fifo, "rb") as f:
        f.read()
    assert time.monotonic() - started < 3
    with deadlines.step("a quick step", 5, "[restore] timeout_s"):
        pass
    time.sleep(0.05)  # no alarm left behind


def test_criu_s_last_lines_say_where_it_stood(tmp_path: Path) -> None:
    log = tmp_path / "restore.log"
    log.write_text("(00.1) a\n\n(00.2)   Running post-restore scripts\n")
    assert criu_log.last_lines(str(log), 2) == ["(00.1) a", "(00.2) Running post-restore scripts"]
    assert criu_log.last_lines(str(tmp_path / "none.log")) == []
    assert criu_log.last_lines(None) == []
