"""The schedule book torpord runs from (ops/schedule_book.py): one entry per container,
rounds recorded, the next one due from the last start, a round's argv as the CLI runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from torpor.errors import ConfigError, TorporError
from torpor.ops.schedule_book import Book, Entry


def test_a_schedule_is_kept_recorded_and_removed(tmp_path: Path) -> None:
    book = Book(str(tmp_path))
    book.add(Entry("default", "web", "localhost/web:s", 60, keep=2, added=100.0))
    book.add(Entry("default", "db", "localhost/db:s", 30, push=True, added=100.0))
    book.add(Entry("default", "web", "localhost/web:t", 90, added=100.0))   # replaces web's
    entries = {e.container: e for e in Book(str(tmp_path)).read()}
    assert entries["web"].ref == "localhost/web:t" and entries["web"].next_due() == 100.0
    book.record(("default", "db"), 200.0, 1.5, 1)
    book.record(("default", "db"), 230.0, 1.0, 0)
    db = {e.container: e for e in book.read()}["db"]
    assert (db.rounds, db.failures, db.last_status, db.next_due()) == (1, 0, 0, 260.0)
    assert db.argv() == ["torpor", "--namespace", "default", "checkpoint", "db", "-t",
                         "localhost/db:s", "--every", "30s", "--rounds", "1", "--push"]
    assert book.remove("default", "web") and not book.remove("default", "web")
    assert [e.container for e in book.read()] == ["db"]
    assert (tmp_path / "schedules.json").stat().st_mode & 0o777 == 0o600


def test_names_that_become_paths_and_a_foreign_book_are_refused(tmp_path: Path) -> None:
    book = Book(str(tmp_path))
    with pytest.raises(TorporError):
        book.add(Entry("default", "../etc", "localhost/x:y", 60))
    (tmp_path / "schedules.json").write_text('{"version": 9, "schedules": []}')
    with pytest.raises(ConfigError, match="version 9"):
        book.read()
