"""Blobs that a download is still bringing, for a rebuild that runs beside it: the rebuild waits
for a pack only when it needs its first chunk, and the download says when each pack is in
place, its digest checked (PullPlan.download). A download that fails wakes every waiter with its
error; a rebuild that fails tells the download to stop (`stopped`)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from torpor.errors import ImageError


class Arrivals:
    def __init__(self, here: Iterable[str] = ()) -> None:
        self._changed = threading.Condition()
        self._here: set[str] = set(here)
        self._error: BaseException | None = None
        self.stopped = threading.Event()   # the rebuild gave up: fetch nothing more

    def arrived(self, digest: str) -> None:
        with self._changed:
            self._here.add(digest)
            self._changed.notify_all()

    def failed(self, error: BaseException) -> None:
        with self._changed:
            self._error = error
            self._changed.notify_all()

    def wait(self, digest: str) -> None:
        """Until the blob `digest` is in place; ImageError if the download failed first."""
        with self._changed:
            while digest not in self._here:
                if self._error is not None:
                    raise ImageError(f"pack {digest} did not arrive: {self._error}") \
                        from self._error
                self._changed.wait()
