"""Blobs that a download is still bringing, for a rebuild that runs beside it: the rebuild waits
for a pack only when it needs its first chunk, and the download says when each pack is in
place, its digest checked (PullPlan.download), and when it is done. A download that fails wakes
every waiter with its error; a rebuild that fails (or is interrupted) cancels: its waiters
wake, and the download starts no blob and ends the ones under way (`stopped`)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from torpor.errors import ImageError


class Arrivals:
    def __init__(self, here: Iterable[str] = ()) -> None:
        self._changed = threading.Condition()
        self._here: set[str] = set(here)
        self._error: BaseException | None = None
        self._finished = False
        self.stopped = threading.Event()   # the rebuild gave up: fetch nothing more

    def arrived(self, digest: str) -> None:
        with self._changed:
            self._here.add(digest)
            self._changed.notify_all()

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
