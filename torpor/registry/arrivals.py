"""Blobs that a download is still bringing, for a rebuild that runs beside it: the rebuild waits
for a pack only when it needs its first chunk, and the download says when each pack is in
place, its digest checked (PullPlan.download), and when it is done. A download that fails wakes
every waiter with its error; a rebuild that fails (or is interrupted) cancels: its waiters
wake, and the download starts no blob and ends the ones under way (`stopped`).

A lazy restore's page source reads a pack while it is still coming (`Arrivals(partial=True)`):
the download tells how many bytes of each blob are in its file so far (`growing`), and
`readable` says which file holds a blob's first bytes, the finished blob or the one still
being written. Those bytes are not checked yet (the blob's digest is, once whole); the reader
checks what it reads (each chunk's sha256). A blob the download brought (or found in place
and hashed) is told `arrived` only once its digest is checked (`checked`: its reader may then
trust what the blob's own index says of it); the blobs given as `here` were not hashed here."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from torpor.errors import ImageError


class Arrivals:
    def __init__(self, here: Iterable[str] = (), partial: bool = False) -> None:
        """`partial`: the download tells each blob's bytes as they are written (`growing`)."""
        self.partial = partial
        self._changed = threading.Condition()
        self._here: set[str] = set(here)
        self._checked: set[str] = set()                  # arrived, its digest checked
        self._paths: dict[str, str] = {}                 # arrived: where it is
        self._growing: dict[str, tuple[str, int]] = {}   # coming: its file, bytes written
        self._written: dict[str, int] = {}               # bytes the download wrote, by blob
        self._moved: dict[str, float] = {}               # when each blob's file last grew
        self._moves = 0                                  # grows with every write told
        self._error: BaseException | None = None
        self._finished = False
        self.stopped = threading.Event()   # the rebuild gave up: fetch nothing more

    def arrived(self, digest: str, path: str | None = None) -> None:
        """The blob `digest` is in place (at `path`), its digest checked."""
        with self._changed:
            self._here.add(digest)
            self._checked.add(digest)
            self._growing.pop(digest, None)
            self._moves += 1
            if path is not None:
                self._paths[digest] = path
            self._changed.notify_all()

    def growing(self, digest: str, path: str, size: int) -> None:
        """The download's file for `digest` (not yet checked) holds its first `size` bytes."""
        with self._changed:
            if digest not in self._here:
                if digest not in self._written or size > self._written[digest]:
                    self._moved[digest] = time.monotonic()   # grew (or began): not a retry
                self._growing[digest] = (path, size)
                self._written[digest] = size
                self._moves += 1
                self._changed.notify_all()

    @property
    def bytes_written(self) -> int:
        """What the download has written so far (of blobs told with `growing`)."""
        with self._changed:
            return sum(self._written.values())

    @property
    def ended(self) -> bool:
        """The download failed, was stopped, or is done: it brings nothing more."""
        with self._changed:
            return self._error is not None or self._finished

    def checked(self, digest: str) -> bool:
        """Whether the blob `digest` arrived, its digest checked by this download."""
        with self._changed:
            return digest in self._checked

    def readable(self, digest: str, end: int, wait_s: float = 0.0, stall_s: float = 1.0,
                 whole: bool = False, own_stall_s: float = 10.0) -> tuple[str, bool] | None:
        """A file holding the first `end` bytes of blob `digest`, and whether its digest is
        checked: the blob in place, or (unless `whole`) its download's file so far, not
        checked; waiting up to `wait_s` for it while the download moves. It gives up once
        nothing was written for `stall_s`, or, once this blob's own download has begun,
        nothing to it for `own_stall_s` (one stuck connection while the others move; longer,
        since a slow one tells its progress a MiB at a time); a `whole` wait that gives up
        takes the download's file so far if it holds the bytes. None when there is none by
        then, or once no download will bring it (failed, finished, stopped): read it
        elsewhere."""
        now = time.monotonic()
        give_up, stall = now + wait_s, now + stall_s
        with self._changed:
            moves = self._moves
            while True:
                if digest in self._here:
                    path = self._paths.get(digest)
                    return None if path is None else (path, digest in self._checked)
                path, size = self._growing.get(digest, ("", 0))
                if size >= end and not whole:
                    return path, False
                now = time.monotonic()
                if self._moves != moves:
                    moves, stall = self._moves, now + stall_s
                if digest in self._moved:
                    stall = min(stall, self._moved[digest] + own_stall_s)
                left = min(give_up, stall) - now
                if left <= 0 or self._error is not None or self._finished:
                    return (path, False) if whole and size >= end else None
                self._changed.wait(left)

    def finished(self) -> None:
        """The download is done: a blob not in by now will not come."""
        with self._changed:
            self._finished = True
            self._changed.notify_all()

    def failed(self, error: BaseException) -> None:
        with self._changed:
            if self._error is None:
                self._error = error
            self._changed.notify_all()

    @property
    def first_error(self) -> BaseException | None:
        """The first failure told: the download's, or the rebuild's cancel."""
        with self._changed:
            return self._error

    def cancel(self, why: BaseException) -> None:
        """The rebuild stops: its waiters raise, the download stops."""
        self.stopped.set()
        self.failed(why)

    def wait(self, digest: str) -> None:
        """Until the blob `digest` is in place; ImageError once the download failed (its blobs
        may be gone again) or ended without it, or the rebuild was cancelled."""
        with self._changed:
            while True:
                if self._error is not None:
                    raise ImageError(f"pack {digest} did not arrive: {self._error}") \
                        from self._error
                if digest in self._here:
                    return
                if self._finished:
                    raise ImageError(f"pack {digest} is not among the layers downloaded")
                self._changed.wait()
