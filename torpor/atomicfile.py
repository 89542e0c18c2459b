"""Atomic file writes: a temporary file in the same directory, fsync, rename, fsync of the
directory.

Stdlib only (`os`): torpor-runc and torpor-hook write with it on every container start.
"""

from __future__ import annotations

import os
from _thread import get_ident  # builtin: threading would cost a millisecond here


def write_atomic(path: str, data: bytes, mode: int | None = None, durable: bool = True) -> None:
    """Write `data` to `path` so that readers see the old or the new file, never a mix; with
    `durable`, the data is on disk before the rename, and the rename once this returns."""
    directory = os.path.dirname(os.path.abspath(path))
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    tmp = os.path.join(directory, f".{os.path.basename(path)}.torpor-{os.getpid()}-{get_ident()}")
    fd = _create(tmp, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)
    if durable:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _create(tmp: str, mode: int) -> int:
    """A new file at `tmp`, never through what is there already: a symlink planted at the
    (guessable) temporary name is not followed, and a stale file left by a writer that died
    with the same pid and thread is removed first."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(tmp, flags, mode)
    except FileExistsError:
        os.unlink(tmp)   # the name itself, never what a link there points to
        return os.open(tmp, flags, mode)
