"""Files on disk before anything relies on them: the one place torpor makes a checkpoint durable.

A checkpoint that stops its container commits only once its files (CRIU's images, packs, layers,
checkpoint.json) and the directories that name them have reached the disk: a power loss right
after the commit must leave a checkpoint that restores, not a stopped container and files that
were only in the page cache. `sync_tree` does it in bulk: every regular file and every directory
under the root is fsynced, many at once (fsync releases the GIL; the filesystem joins the
flushes into few journal commits), then the root's own entry in its parent. `syncfs` of the
whole filesystem is the other way, measured against it in bench/durability.py; it also writes
out everything else that is dirty on that filesystem, so it is not the default. `Writeback`
starts the writing early: while CRIU dumps a checkpoint -o DIR, torpor-runc asks the kernel to
write what CRIU has written so far, so the sync after the dump finds it mostly on disk (64 MiB:
~4 ms instead of ~25 ms here).

Stdlib only: torpor-runc and CRIU's post-dump hook use it.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass

WORKERS = 8


@dataclass(frozen=True)
class Synced:
    files: int
    directories: int
    bytes: int
    seconds: float


def sync_dir(path: str) -> None:
    """The directory's entries (names created, renamed or removed in it) on disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(*roots: str, parents: bool = True) -> Synced:
    """Every regular file and directory under each root on disk, then (with `parents`) the
    root's entry in its parent directory. Symbolic links are not followed (their entry is the
    directory's). A root that does not exist is skipped."""
    started = time.monotonic()
    files: list[str] = []
    directories: list[str] = []
    size = 0
    for root in roots:
        if not os.path.isdir(root):
            if os.path.isfile(root):
                files.append(root)
                size += os.stat(root).st_size
            continue
        for directory, _, names in os.walk(root):
            directories.append(directory)
            for name in names:
                path = os.path.join(directory, name)
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode):
                    files.append(path)
                    size += st.st_size
    _fsync_all(files)
    _fsync_all(directories, directory=True)
    if parents:
        for parent in sorted({os.path.dirname(os.path.abspath(r)) for r in roots}):
            if os.path.isdir(parent):
                sync_dir(parent)
    return Synced(len(files), len(directories), size, time.monotonic() - started)


class Writeback:
    """While a writer (CRIU) fills the files under `root`, every `interval` ask the kernel to
    start writing what they hold so far to disk (sync_file_range(2), SYNC_FILE_RANGE_WRITE),
    on a thread of its own: the sync_tree that follows the writer then finds most of it there."""

    def __init__(self, root: str, interval: float = 0.01) -> None:
        import threading

        self.root, self.interval = root, interval
        self.started: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torpor-writeback", daemon=True)

    def __enter__(self) -> Writeback:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import ctypes

        try:
            call = ctypes.CDLL(None, use_errno=True).sync_file_range
        except (OSError, AttributeError):
            return
        call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        while not self._stop.wait(self.interval):
            for directory, _, names in os.walk(self.root):
                for name in names:
                    path = os.path.join(directory, name)
                    try:
                        size = os.lstat(path).st_size
                    except OSError:
                        continue
                    done = self.started.get(path, 0)
                    if size - done < (1 << 20):
                        continue
                    try:
                        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
                    except OSError:
                        continue
                    try:
                        call(fd, done, size - done, 2)   # SYNC_FILE_RANGE_WRITE
                    finally:
                        os.close(fd)
                    self.started[path] = size


def syncfs(path: str) -> float:
    """syncfs(2) of the filesystem holding `path` (everything dirty on it); the seconds taken."""
    import ctypes

    started = time.monotonic()
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.syncfs(fd) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno), path)
    finally:
        os.close(fd)
    return time.monotonic() - started


def _fsync_all(paths: list[str], directory: bool = False) -> None:
    one = sync_dir if directory else sync_file
    if len(paths) <= 2:
        for path in paths:
            one(path)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(WORKERS, len(paths))) as pool:
        for _ in pool.map(one, paths):  # the first error is raised
            pass
