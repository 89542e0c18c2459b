"""durable.Writeback: while a writer fills files, their writing to disk is started as they grow
(the checkpoint's sync after the dump then waits for little). What is written stays whole, the
files it cannot reach are skipped, and it stops when told."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from torpor import durable


def test_files_written_under_it_stay_whole_and_are_started(tmp_path: Path) -> None:
    piece = os.urandom(1 << 20)
    with durable.Writeback(str(tmp_path), interval=0.005) as writeback:
        with open(tmp_path / "pages-1.img", "wb") as f:
            for _ in range(16):
                f.write(piece)
                f.flush()
                time.sleep(0.01)
        (tmp_path / "core-1.img").write_bytes(b"x" * 100)   # small: left to the sync
        (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
        time.sleep(0.05)
    assert writeback.started[str(tmp_path / "pages-1.img")] >= 8 << 20
    assert str(tmp_path / "core-1.img") not in writeback.started
    assert hashlib.sha256((tmp_path / "pages-1.img").read_bytes()).digest() == \
        hashlib.sha256(piece * 16).digest()
    durable.sync_tree(str(tmp_path))   # and the sync after it is as before


def test_it_stops_at_once(tmp_path: Path) -> None:
    started = time.monotonic()
    with durable.Writeback(str(tmp_path), interval=5.0):
        pass
    assert time.monotonic() - started < 1.0
