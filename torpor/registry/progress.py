"""Byte progress of a transfer of several blobs at once, for a CLI progress bar.

Each blob reports how far it got; a blob that starts over (a retry) does not move the total
back, so the bar only grows. The callback gets (bytes done, bytes in all) from any worker
thread, one call at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from torpor.reporting import ByteProgress


class TransferProgress:
    def __init__(self, total: int, callback: ByteProgress | None) -> None:
        self.total, self._callback = total, callback
        self._lock = threading.Lock()
        self._furthest: dict[str, int] = {}
        self.done = 0

    def reporter(self, digest: str) -> Callable[[int], None]:
        """A function that records `digest` having reached an offset."""
        def report(offset: int) -> None:
            self.advance(digest, offset)
        return report

    def advance(self, digest: str, offset: int) -> None:
        with self._lock:
            before = self._furthest.get(digest, 0)
            if offset <= before:
                return
            self._furthest[digest] = offset
            self.done += offset - before
            if self._callback is not None:
                self._callback(self.done, self.total)
