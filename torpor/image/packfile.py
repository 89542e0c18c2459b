"""The pack blob: chunks as zstd frames back to back, then the pack's own index.

A pack is the zstd frames of its chunks, one frame per chunk (level and parameters fixed, no
checksum, content size written), then its index in a zstd skippable frame: magic 0x184D2A5E,
u32 length, the pack index JSON (formats/chunk_index.py), u64 length of that JSON,
b"torpack1". The whole pack is therefore a valid zstd stream (`zstd -d` gives the chunks
concatenated), a pack can be read without any generation's index, and the same chunks in the
same order always give the same bytes, so the same digest (for a given libzstd: chunks are
matched by the digest of their plain bytes, so a new libzstd costs no deduplication).
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time

import zstandard

from torpor.errors import ImageError
from torpor.formats.chunk_index import PackIndex, PackRecord

LEVEL = 1                    # zstd level: memory pages compress no better at 3 (docs/benchmarks.md)
SKIPPABLE_MAGIC = 0x184D2A5E
TRAILER_MAGIC = b"torpack1"
_TRAILER = struct.Struct("<Q8s")


def compressor(level: int = LEVEL) -> zstandard.ZstdCompressor:
    """The one compressor setting of packs (deterministic output for a given libzstd)."""
    return zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True,
                                    write_dict_id=False, threads=0)


class PackWriter:
    """One pack being written under `directory`; `finish()` names it by its digest."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.tmp = os.path.join(directory, f".pack-{os.getpid()}-{threading.get_ident()}-"
                                           f"{time.monotonic_ns()}.tmp")
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self.hasher = hashlib.sha256()
        self.size = 0
        self.entries: list[tuple[str, int, int, int]] = []

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        self.hasher.update(data)
        self.size += len(data)

    def add(self, digest: str, frame: bytes, plain_length: int) -> int:
        """Append a chunk's frame; returns its offset."""
        offset = self.size
        self._write(frame)
        self.entries.append((digest, offset, len(frame), plain_length))
        return offset

    def finish(self) -> PackRecord:
        index = PackIndex(tuple(self.entries)).to_json()
        self._write(struct.pack("<II", SKIPPABLE_MAGIC, len(index) + _TRAILER.size) + index
                    + _TRAILER.pack(len(index), TRAILER_MAGIC))
        os.close(self.fd)
        self.fd = -1
        digest = "sha256:" + self.hasher.hexdigest()
        os.rename(self.tmp, os.path.join(self.directory, digest.removeprefix("sha256:")))
        return PackRecord(digest, self.size)

    def abandon(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            os.unlink(self.tmp)


def read_pack_index(path: str) -> PackIndex:
    """The index at the end of a pack file."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8 + _TRAILER.size:
            raise ImageError(f"pack {path} is too short to hold its index")
        f.seek(size - _TRAILER.size)
        length, magic = _TRAILER.unpack(f.read(_TRAILER.size))
        start = size - _TRAILER.size - length - 8
        if magic != TRAILER_MAGIC or start < 0:
            raise ImageError(f"pack {path} does not end with a pack index")
        f.seek(start)
        frame_magic, frame_size = struct.unpack("<II", f.read(8))
        if frame_magic != SKIPPABLE_MAGIC or frame_size != length + _TRAILER.size:
            raise ImageError(f"pack {path}: its index frame is malformed")
        return PackIndex.from_json(f.read(length), start)
