"""Paths a checkpoint is written to: only root and the user who runs torpor may reach them
(torpor/output_path.py). Real directories, chowned to nobody where another user owns them."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from torpor import output_path
from torpor.errors import CheckpointError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
NOBODY = pwd.getpwnam("nobody").pw_uid


def owned_by_nobody(path: Path, mode: int = 0o755) -> Path:
    path.mkdir(mode=mode)
    os.chmod(path, mode)
    os.chown(path, NOBODY, -1)
    return path


def prepare(path: Path) -> bool:
    return output_path.prepare_dir(str(path), "the checkpoint", CheckpointError)


def test_new_and_own_directories_are_made_private(tmp_path: Path) -> None:
    assert prepare(tmp_path / "new" / "ck") is True
    assert (tmp_path / "new" / "ck").stat().st_mode & 0o777 == 0o700
    (tmp_path / "mine").mkdir(mode=0o755)
    assert prepare(tmp_path / "mine") is False
    assert (tmp_path / "mine").stat().st_mode & 0o777 == 0o700
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # like /tmp: others may write, but not move what is ours
    assert prepare(sticky / "ck") is True


def hostile_place(tmp_path: Path, case: str) -> tuple[Path, str]:
    """A path to write to that another user (nobody) can change, and the words of its refusal."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    theirs = "belongs to user nobody"
    if case == "its-own":
        return owned_by_nobody(tmp_path / "ck", 0o700), theirs
    if case == "parent":
        return owned_by_nobody(tmp_path / "theirs") / "ck", theirs
    if case == "grandparent":
        return owned_by_nobody(tmp_path / "theirs") / "a" / "ck", theirs
    if case == "others-write":
        (tmp_path / "open").mkdir()
        os.chmod(tmp_path / "open", 0o777)
        return tmp_path / "open" / "ck", "writable by others"
    if case == "link-on-the-way":
        os.symlink(tmp_path, sticky / "via")
        os.lchown(sticky / "via", NOBODY, -1)
        return sticky / "via" / "ck", theirs
    if case == "link-itself":
        (tmp_path / "real").mkdir()
        os.symlink(tmp_path / "real", sticky / "ck")
        os.lchown(sticky / "ck", NOBODY, -1)
        return sticky / "ck", theirs
    assert case == "not-empty"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").touch()
    return tmp_path / "full", "not an empty directory"


@pytest.mark.parametrize("case", ["its-own", "parent", "grandparent", "others-write",
                                  "link-on-the-way", "link-itself", "not-empty"])
def test_a_place_another_user_can_change_is_refused_and_nothing_written(
        tmp_path: Path, case: str) -> None:
    path, words = hostile_place(tmp_path, case)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(CheckpointError, match=words):
        prepare(path)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_the_user_who_ran_torpor_through_sudo_may_own_it(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = owned_by_nobody(tmp_path / "home")
    with pytest.raises(CheckpointError):
        prepare(theirs / "ck")
    monkeypatch.setenv("SUDO_UID", str(NOBODY))
    assert prepare(theirs / "ck") is True
