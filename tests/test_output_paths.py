"""A checkpoint holds a workload's memory: torpor never writes one where another user can reach
it. Directories chowned to nobody, on real containerd, runc and CRIU: every command that writes
a checkpoint, a layout or an archive to a path the user gives refuses in words, writes nothing,
and the container runs on."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from .conftest import run_torpor
from .support.containerd import Node
from .support.workload import COUNTER, containers, task_status, wait_counter_above

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]


def nobodys(path: Path) -> Path:
    path.mkdir(mode=0o755)
    os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    return path


def refused(node: Node, *args: str) -> str:
    result = run_torpor(node, *args, check=False)
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    return result.stderr


def test_no_checkpoint_is_written_where_another_user_can_reach_it(
        node: Node, tmp_path: Path, test_image: dict[str, object]) -> None:
    name = "private-out"
    theirs = nobodys(tmp_path / "theirs")       # an empty directory of another user
    parent = nobodys(tmp_path / "their-home")   # a new directory inside one
    with containers(node) as names:
        names.append(name)
        node.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c", COUNTER)
        before = wait_counter_above(node, name, 5)
        for args in (["-o", str(theirs)], ["-o", str(theirs), "--oci"],
                     ["-o", str(parent / "ck")]):
            said = refused(node, "checkpoint", name, *args)
            assert "belongs to user nobody" in said, said
        assert task_status(node, name) == "RUNNING"
        wait_counter_above(node, name, before + 5)
        # a genuine checkpoint, then every other writer of a user-given path
        run_torpor(node, "checkpoint", name, "-o", str(tmp_path / "ck"), "--leave-running")
    for args in (["kube", "archive", str(tmp_path / "ck"), "-o", str(parent / "ck.tar")],
                 ["kube", "image", str(tmp_path / "ck"), "-o", str(theirs)],
                 ["pull", "127.0.0.1:9/never/contacted:1", "-o", str(theirs)],
                 ["pull", "127.0.0.1:9/never/contacted:1", "-o", str(parent / "layout")]):
        said = refused(node, *args)
        assert "belongs to user nobody" in said, (args, said)
    assert list(theirs.iterdir()) == [] and list(parent.iterdir()) == []
