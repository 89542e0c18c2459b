"""Packs a lazy restore's download brought whole and checked, and where their chunks lie.

Once a pack's digest is checked whole, its own index (which that digest covers) vouches for
the frames it lists: a chunk the chunk index places at exactly such a frame's offset, length
and size is not hashed again (image/reassemble.decode_chunk's `vouched`). A vouched chunk
stored raw is not even read: `CheckedPack.in_pack` reads its frame header and block headers,
and if they are the ones torpor writes (image/packfile.raw_spans), gives the ranges of the
file that hold its bytes (`InPack`), which the page server sends from the page cache
(pieces.py). Any other frame is read and decoded, and a damaged one refused, so an eager and
a lazy restore of one image give the same bytes or the same refusal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from torpor.formats.chunk_index import ChunkRecord
from torpor.image.packfile import raw_frame_length, raw_spans
from torpor.image.reassemble import Vouched
from torpor.lazy.pieces import FileRange, OpenFile, contents


@dataclass(frozen=True)
class InPack:
    """A raw chunk where it lies in a pack this restore checked whole: the (offset, length)
    of its bytes in the pack's `file`. Sent from there (pieces.py)."""
    file: OpenFile
    spans: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        return sum(length for _, length in self.spans)

    def ranges(self, lo: int, hi: int) -> list[FileRange]:
        """The file ranges of the chunk's bytes `lo` to `hi`, asked of the disk now if they
        are not in the page cache (the page server's sender is to find them there)."""
        out, at = [], 0
        for offset, length in self.spans:
            a, b = max(lo, at), min(hi, at + length)
            if a < b:
                out.append(FileRange(self.file, offset + a - at, b - a))
            at += length
        if out:
            os.posix_fadvise(self.file.fd, out[0].offset,
                             out[-1].offset + out[-1].length - out[0].offset,
                             os.POSIX_FADV_WILLNEED)
        return out

    def read(self) -> bytes:
        return b"".join(contents(r) for r in self.ranges(0, self.size))


@dataclass(frozen=True)
class CheckedPack:
    """A pack this restore's download brought whole, its digest checked, open; `vouched`: its
    own index (None when it has none: its chunks are then hashed)."""
    file: OpenFile
    vouched: Vouched | None

    def in_pack(self, chunk: ChunkRecord) -> InPack | None:
        """The chunk where it lies, if its pack's own index lists it there and it is stored
        raw, its frame's headers as torpor writes them; else None (read and decoded)."""
        if self.vouched is None or chunk.length != raw_frame_length(chunk.plain_length) or \
                (chunk.digest, chunk.offset, chunk.length, chunk.plain_length) \
                not in self.vouched:
            return None
        spans = raw_spans(self.file.fd, chunk.offset, chunk.plain_length)
        return None if spans is None else InPack(self.file, tuple(spans))
