"""The packs a lazy restore fetched, kept for the node's image store, so that the next restore
of the image (or of its next generation) reads them here instead of from the registry.

Each range the page source fetched is written where it lies, in a file of its own pack, as it
arrives. Once every page is in, `finish` fetches what no page asked for (the chunks of other
generations a pack also holds), checks each file against its pack's digest as a pull does, and
moves it into the layout the restore downloaded the rest of the image into; a pack this node
already held is linked from the store. A failure here costs the restore nothing: the workload
already has all its memory; the image is then not stored.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

from torpor.errors import DigestMismatch
from torpor.formats.chunk_index import PackRecord
from torpor.formats.digests import new_hasher, verify_hasher
from torpor.lazy.chunks import LocalPack, RemoteRange
from torpor.registry.layout import Layout

GAP_BYTES = 8 << 20   # one range request at most, for the gaps


class PackKeeper:
    def __init__(self, directory: str, packs: Sequence[PackRecord]) -> None:
        self.directory, self.packs = directory, packs
        self.failure: OSError | None = None   # keeping stopped: the restore goes on without
        self._held: dict[int, list[tuple[int, int]]] = {}   # pack -> (start, end) written
        self._sealed = False
        self._lock = threading.Lock()
        os.makedirs(directory, mode=0o700, exist_ok=True)

    def add(self, pack: int, offset: int, data: bytes | bytearray) -> None:
        """A range of `pack` as the registry sent it (unverified: `finish` checks the whole).
        Called on the page-fault path: it never raises; a failure (no space, say) only ends
        the keeping. A range that comes after `finish` began (a fetcher retrying late) is
        dropped."""
        with self._lock:
            if self._sealed or self.failure is not None:
                return
            try:
                fd = os.open(self._path(pack), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    os.pwrite(fd, data, offset)
                finally:
                    os.close(fd)
            except OSError as e:
                self.failure = e
                return
            self._held.setdefault(pack, []).append((offset, offset + len(data)))

    def gaps(self, pack: int) -> list[tuple[int, int]]:
        """The ranges (start, length) of `pack` not written yet."""
        gaps, at = [], 0
        for start, end in sorted(self._held.get(pack, [])):
            if start > at:
                gaps.append((at, start - at))
            at = max(at, end)
        if at < self.packs[pack].size:
            gaps.append((at, self.packs[pack].size - at))
        return gaps

    def finish(self, remote: RemoteRange, local: LocalPack, layout: Path) -> int:
        """Every pack whole and checked in `layout`'s blobs; the bytes fetched for the gaps.
        Nothing the page source fetches after this call begins is written."""
        with self._lock:
            self._sealed = True
        if self.failure is not None:
            raise self.failure
        fetched = 0
        blobs = Layout(layout)
        for number, pack in enumerate(self.packs):
            target = blobs.blob_path(pack.digest)   # the digest validated before it names a file
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            here = local(pack.digest, pack.size) if number not in self._held else None
            if here is not None:
                _link(Path(here), target)
                continue
            fd = os.open(self._path(number), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                for start, length in self.gaps(number):
                    for at in range(start, start + length, GAP_BYTES):
                        piece = remote(pack.digest, at, min(GAP_BYTES, start + length - at))
                        os.pwrite(fd, piece, at)
                        fetched += len(piece)
                _check(fd, pack)
            finally:
                os.close(fd)
            os.replace(self._path(number), target)
        return fetched

    def _path(self, pack: int) -> str:
        return os.path.join(self.directory, f"pack-{pack}")


def _check(fd: int, pack: PackRecord) -> None:
    size = os.fstat(fd).st_size
    if size != pack.size:
        raise DigestMismatch(f"pack {pack.digest} came to {size} bytes, not {pack.size}")
    hasher, at = new_hasher(pack.digest), 0
    while at < size:
        piece = os.pread(fd, min(8 << 20, size - at), at)
        hasher.update(piece)
        at += len(piece)
    verify_hasher(hasher, pack.digest, f"pack {pack.digest}, as the lazy restore fetched it")


def _link(source: Path, target: Path) -> None:
    if target.exists():
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
