"""What a killed operation leaves is swept; what a live one holds is not (store scratch space,
restore on create's directories)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from torpor import held_dirs
from torpor.image.store import Store


def test_a_held_directory_is_left_and_an_abandoned_one_swept(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    with store.scratch() as live:
        # an operation that died holding its directory: the lock went with it
        dead = subprocess.run([sys.executable, "-c", (
            "import sys; from torpor import held_dirs; "
            f"held_dirs.make({str(live.parent)!r}, 'op-dead'); sys.exit(0)")], check=True)
        assert dead.returncode == 0
        removed = store.sweep()
        assert str(live.parent / "op-dead") in removed
        assert live.is_dir()                              # still held by this operation
        assert not held_dirs.abandoned(str(live))
    assert not live.exists()


def test_a_directory_being_made_has_no_name_a_sweep_looks_at(tmp_path: Path) -> None:
    fd = held_dirs.make(str(tmp_path), "work")
    try:
        assert os.listdir(tmp_path) == ["work"]
        assert not held_dirs.abandoned(str(tmp_path / "work"))
    finally:
        os.close(fd)
    assert held_dirs.abandoned(str(tmp_path / "work"))
