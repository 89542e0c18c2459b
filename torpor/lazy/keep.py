"""The packs of a lazily restored image, downloaded whole behind the workload, and kept for the
node's image store, so that the next restore of the image (or of its next generation) reads
them here instead of from the registry.

As the page source starts (before CRIU restores the task), the packs this node lacks are
downloaded in the chunk index's order (the order the generation's files first use them: a
generation's own packs in address order), a few at once as a pull downloads them, into the
restore's layout, each checked against its digest once whole and none left half-written; the
page source reads CRIU's background ranges from each pack once it is whole and checked, and a
page fault from what the download has written so far (chunks.py, registry/arrivals.py). That
download is the read-ahead: a page fault it has not brought yet goes to the registry by range
request. `finish` waits for the download (until the
restore's deadline) and links the packs this node held already into the layout. A failure here
costs the restore nothing: the page source then fetches by range what is still missing, and
the image is not stored.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from torpor.errors import ImageError
from torpor.formats.chunk_index import PackRecord
from torpor.lazy.chunks import LocalPack
from torpor.registry.arrivals import Arrivals
from torpor.registry.layout import Layout

Fetch = Callable[[Sequence[str], Arrivals], None]   # the packs' digests, in order
CANCEL_WAIT_S = 5.0   # a download told to stop, waited for before the restore cleans up


class PackDownload:
    def __init__(self, layout: str, packs: Sequence[PackRecord], local: LocalPack,
                 fetch: Fetch) -> None:
        """`fetch(digests, arrivals)` downloads the packs `digests` into `layout`, in that
        order, telling `arrivals` (registry/pull.py PullPlan.download)."""
        self.layout, self.packs, self._local, self._fetch = layout, packs, local, fetch
        self.arrivals = Arrivals(partial=True)
        self._thread: threading.Thread | None = None
        self._outcome: list[BaseException | None] = []

    def start(self) -> Arrivals:
        """The download of the packs not on this node, on a thread of its own."""
        wanted = [p.digest for p in self.packs if self._local(p.digest, p.size) is None]

        def run() -> None:
            try:
                self._fetch(list(dict.fromkeys(wanted)), self.arrivals)
                self._outcome.append(None)
                self.arrivals.finished()
            except BaseException as e:   # the page source goes on by range requests
                self._outcome.append(e)
                self.arrivals.failed(e)

        self._thread = threading.Thread(target=run, name="torpor-lazy-packs", daemon=True)
        self._thread.start()
        return self.arrivals

    @property
    def bytes_written(self) -> int:
        """What the download has brought so far, whatever became of it."""
        return self.arrivals.bytes_written

    def cancel(self) -> None:
        """The restore gave up: the download starts no pack and ends the ones under way. Waits
        a few seconds for it (a read blocked on the network ends when it returns; the thread
        then writes nothing more)."""
        if self._thread is not None and self._thread.is_alive():
            self.arrivals.cancel(ImageError("the lazy restore ended"))
            self._thread.join(CANCEL_WAIT_S)

    def finish(self, give_up_at: float = float("inf")) -> int:
        """Every pack in the layout, whole and checked; the bytes downloaded. Past
        `give_up_at` (monotonic) the download is stopped and that is an error."""
        if self._thread is None:
            raise ImageError("the packs' download was not started")
        self._thread.join(None if give_up_at == float("inf") else
                          max(0.0, give_up_at - time.monotonic()))
        if self._thread.is_alive():
            self.cancel()
            raise ImageError("the packs' download did not end before the restore's deadline")
        [failure] = self._outcome
        if failure is not None:
            raise failure
        blobs = Layout(Path(self.layout))
        for pack in self.packs:
            target = blobs.blob_path(pack.digest)   # the digest validated before it names a file
            if target.exists():
                continue
            here = self._local(pack.digest, pack.size)
            if here is None:
                raise ImageError(f"pack {pack.digest} is neither downloaded nor on this node")
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _link(Path(here), target)
        return self.bytes_written


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except FileExistsError:
        return
    except OSError:
        shutil.copyfile(source, target)
