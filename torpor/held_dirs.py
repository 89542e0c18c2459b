"""Directories an operation holds while it lives (an flock on the directory itself), so that
a sweep removes what a killed one left, and nothing one still uses. Stdlib only."""

from __future__ import annotations

import fcntl
import os
import shutil


def make(parent: str, name: str) -> int:
    """`parent/name`, made 0700 and locked before it has that name (a sweep passes over the
    names that start with '.'); the descriptor that holds it: close it once the directory is
    removed."""
    hidden = os.path.join(parent, f".{name}")
    os.makedirs(hidden, mode=0o700)
    fd = os.open(hidden, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(hidden, os.path.join(parent, name))
    except BaseException:
        os.close(fd)
        shutil.rmtree(hidden, ignore_errors=True)
        raise
    return fd


def abandoned(path: str) -> bool:
    """Whether no live operation holds `path`, a directory `make` made."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False   # in use
    finally:
        os.close(fd)
    return True
