"""The records of lazy restores under way: what `torpor ls --restores` and torpord read."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from torpor.lazy import progress
from torpor.service.lazy_metrics import LazyRestores


def record(container: str, pid: int, namespace: str = "default") -> progress.LazyProgress:
    return progress.LazyProgress(namespace, container, "reg/x:1", 64 << 20, 16 << 20, 8 << 20,
                                 0, 1000.0, pid)


def test_a_restore_is_listed_while_its_process_lives(tmp_path: Path) -> None:
    progress.write(str(tmp_path), record("web", os.getpid()))
    [found] = progress.current(str(tmp_path))
    assert (found.container, found.fraction) == ("web", 0.25)
    progress.remove(str(tmp_path), "default", "web")
    assert progress.current(str(tmp_path)) == []


def test_a_record_whose_restore_died_is_dropped(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    progress.write(str(tmp_path), record("gone", dead.pid))
    assert progress.current(str(tmp_path)) == []
    assert os.listdir(tmp_path / progress.DIR) == []


def test_no_name_steps_out_of_the_directory(tmp_path: Path) -> None:
    progress.write(str(tmp_path), record("../../escape", os.getpid(), namespace="../x"))
    [name] = os.listdir(tmp_path / progress.DIR)
    assert "/" not in name and ".." not in name
    assert [p.container for p in progress.current(str(tmp_path))] == ["../../escape"]


def test_torpord_exports_them_as_gauges(tmp_path: Path) -> None:
    progress.write(str(tmp_path), record("web", os.getpid()))
    families = {f.name: f for f in LazyRestores(str(tmp_path)).collect()}
    [total] = families["torpor_lazy_restore_bytes"].samples
    [placed] = families["torpor_lazy_restore_placed_bytes"].samples
    assert total.labels == {"namespace": "default", "container": "web"}
    assert (total.value, placed.value) == (64 << 20, 16 << 20)


def test_names_that_differ_keep_records_apart(tmp_path: Path) -> None:
    progress.write(str(tmp_path), record("c", os.getpid(), namespace="a.b"))
    progress.write(str(tmp_path), record("b.c", os.getpid(), namespace="a"))
    progress.remove(str(tmp_path), "a", "b.c")
    assert [(p.namespace, p.container) for p in progress.current(str(tmp_path))] == [("a.b", "c")]


def test_a_reused_pid_is_no_match(tmp_path: Path) -> None:
    stale = progress.LazyProgress("default", "old", "reg/x:1", 1, 0, 0, 0, 1.0, os.getpid(),
                                  progress.start_time(os.getpid()) + 1)
    progress.write(str(tmp_path), stale)
    assert progress.current(str(tmp_path)) == []


def test_a_temp_file_is_no_record(tmp_path: Path) -> None:
    progress.write(str(tmp_path), record("web", os.getpid()))
    directory = tmp_path / progress.DIR
    [name] = os.listdir(directory)
    (directory / f".{name}.torpor-1-2").write_text((directory / name).read_text())
    assert len(progress.current(str(tmp_path))) == 1


def test_an_images_restores_are_found_by_its_name_or_its_digest(tmp_path: Path) -> None:
    """`torpor inspect` of an image shows its restores under way: restored by the name it
    was given, or by any other name for the same image (its index digest)."""
    me = progress.start_time(os.getpid())
    for container, source, digest in (("by-name", "reg/x:1", ""),
                                      ("by-mirror", "mirror/x:1", "sha256:aa"),
                                      ("other", "reg/y:1", "sha256:bb")):
        progress.write(str(tmp_path), progress.LazyProgress(
            "default", container, source, 1, 0, 0, 0, 1.0, os.getpid(), me, digest))
    found = progress.of_image(str(tmp_path), "reg/x:1", "sha256:aa")
    assert sorted(p.container for p in found) == ["by-mirror", "by-name"]
    assert [p.container for p in progress.of_image(str(tmp_path), "reg/z:1", None)] == []
    assert [p.container for p in progress.of_image(str(tmp_path), "reg/z:1", "")] == []
