"""The pack blob: chunks as zstd frames back to back, then the pack's own index.

A pack is the zstd frames of its chunks, one frame per chunk (level and parameters fixed, no
checksum, content size written), then its index in a zstd skippable frame: magic 0x184D2A5E,
u32 length, the pack index JSON (formats/chunk_index.py), u64 length of that JSON,
b"torpack1". The whole pack is therefore a valid zstd stream (`zstd -d` gives the chunks
concatenated), a pack can be read without any generation's index, and the same chunks in the
same order always give the same bytes, so the same digest (for a given libzstd: chunks are
matched by the digest of their plain bytes, so a new libzstd costs no deduplication).

A chunk that does not compress (random memory, encrypted data; see `encode`) is stored as a
**raw zstd frame**: the frame header (content size written, single segment) and the chunk's
bytes in Raw blocks of at most 128 KiB, each behind its 3-byte block header. That is legal
zstd (any zstd reads it, at memcpy speed), so the pack stays one zstd stream and the chunk
index needs no new field: the choice is recorded in the frame itself, and `raw_content`
recognises such a frame by its exact bytes, so a restore hashes and writes its bytes straight
from the frame without a decompressor. It is written from the caller's buffer (writev), with
no compression and no copy.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Executor, Future

import zstandard

from torpor.errors import ImageError
from torpor.formats.chunk_index import PackIndex, PackRecord

LEVEL = 1                    # zstd level: memory pages compress no better at 3 (docs/benchmarks.md)
SKIPPABLE_MAGIC = 0x184D2A5E
TRAILER_MAGIC = b"torpack1"
_TRAILER = struct.Struct("<Q8s")
RAW = b""                    # FrameEncoder's answer for a chunk stored raw (never a zstd frame)
RAW_BLOCK = 128 << 10        # zstd's largest block
RAW_ABOVE = 0.9              # a chunk is stored raw unless zstd makes it at most 0.9 of its size
SAMPLE = 4096                # bytes of each of the two pieces of the trial (start, middle)
_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"
_RAW_DESCRIPTOR = b"\xa0"    # single segment, 4-byte content size, no checksum, no dictionary


def compressor(level: int = LEVEL) -> zstandard.ZstdCompressor:
    """The one compressor setting of packs (deterministic output for a given libzstd)."""
    return zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True,
                                    write_dict_id=False, threads=0)


def raw_frame_length(plain_length: int) -> int:
    """The length of the raw zstd frame of `plain_length` bytes."""
    return 9 + 3 * max(1, -(-plain_length // RAW_BLOCK)) + plain_length


def _raw_header(plain_length: int) -> bytes:
    return _FRAME_MAGIC + _RAW_DESCRIPTOR + struct.pack("<I", plain_length)


def _block_header(length: int, last: bool) -> bytes:
    return (length << 3 | int(last)).to_bytes(3, "little")  # block type 0: Raw


def raw_spans(fd: int, offset: int, plain_length: int) -> list[tuple[int, int]] | None:
    """Where the bytes of the raw frame of `plain_length` bytes at `offset` of the file open
    at `fd` lie, as (offset, length) in the file, its frame and block headers read and checked;
    None when what is there is not that frame (a decompressor is then to read it)."""
    first = min(RAW_BLOCK, plain_length)
    if os.pread(fd, 12, offset) != _raw_header(plain_length) + \
            _block_header(first, first == plain_length):
        return None
    spans, at = [(offset + 12, first)], offset + 12 + first
    for start in range(RAW_BLOCK, plain_length, RAW_BLOCK):
        length = min(RAW_BLOCK, plain_length - start)
        if os.pread(fd, 3, at) != _block_header(length, start + length == plain_length):
            return None
        spans.append((at + 3, length))
        at += 3 + length
    return spans


def raw_frame(data: memoryview) -> list[bytes | memoryview]:
    """The pieces of the raw zstd frame of `data` (header, block headers, slices of `data`)."""
    n = len(data)
    pieces: list[bytes | memoryview] = [_raw_header(n)]
    for start in range(0, max(n, 1), RAW_BLOCK):
        end = min(n, start + RAW_BLOCK)
        pieces += [_block_header(end - start, end == n), data[start:end]]
    return pieces


def raw_content(frame: bytes | memoryview, plain_length: int) -> list[memoryview] | None:
    """The bytes a raw zstd frame holds, as slices of `frame`; None when `frame` is not exactly
    the raw frame of `plain_length` bytes torpor writes (then a decompressor reads it)."""
    if len(frame) != raw_frame_length(plain_length) or \
            frame[:9] != _raw_header(plain_length):
        return None
    view = memoryview(frame)
    slices, at = [], 9
    for start in range(0, max(plain_length, 1), RAW_BLOCK):
        length = min(RAW_BLOCK, plain_length - start)
        if frame[at:at + 3] != _block_header(length, start + length == plain_length):
            return None
        slices.append(view[at + 3:at + 3 + length])
        at += 3 + length
    return slices


def encode(zstd: zstandard.ZstdCompressor, data: memoryview) -> bytes | None:
    """The chunk's zstd frame, or None when it is to be stored raw: when a trial on two
    SAMPLE-byte pieces of it (its start and its middle; the whole of a small chunk) does not
    shrink to RAW_ABOVE of their size, or the whole frame does not. The choice depends on the
    chunk's bytes only, so the same chunk always gives the same frame."""
    n = len(data)
    if n > 4 * SAMPLE:
        middle = n // 2 - n // 2 % SAMPLE
        sample = bytes(data[:SAMPLE]) + bytes(data[middle:middle + SAMPLE])
        if len(zstd.compress(sample)) > RAW_ABOVE * len(sample):
            return None
    frame: bytes = zstd.compress(data)
    return frame if len(frame) <= RAW_ABOVE * n else None


class FrameEncoder:
    """Chunks' frames (`encode`) on any thread, a compressor per thread: a zstd frame, or RAW
    for a chunk to be stored raw."""

    def __init__(self, level: int = LEVEL) -> None:
        self.level = level
        self._local = threading.local()

    def frame(self, data: memoryview) -> bytes:
        zstd = getattr(self._local, "zstd", None)
        if zstd is None:
            zstd = self._local.zstd = compressor(self.level)
        found = encode(zstd, data)
        return RAW if found is None else found


class PackWriter:
    """One pack being written under `directory`; `finish()` names it by its digest.

    With `hashing` (an executor of one thread), the pack's sha256 is computed there, in the
    order written, while the caller goes on: the pieces handed in must then stay readable until
    `drain()` (or `finish()`, `abandon()`) returns."""

    def __init__(self, directory: str, hashing: Executor | None = None) -> None:
        self.directory = directory
        self.hashing = hashing
        self._hashed: Future[None] | None = None
        self.tmp = os.path.join(directory, f".pack-{os.getpid()}-{threading.get_ident()}-"
                                           f"{time.monotonic_ns()}.tmp")
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self.hasher = hashlib.sha256()
        self.size = 0
        self.entries: list[tuple[str, int, int, int]] = []

    def _write(self, data: bytes) -> None:
        self._writev([data])

    def _writev(self, pieces: Sequence[bytes | memoryview]) -> None:
        views = [memoryview(p) for p in pieces]
        if self.hashing is not None:
            self._hashed = self.hashing.submit(_hash, self.hasher, [memoryview(p) for p in pieces])
        for view in views:
            if self.hashing is None:
                self.hasher.update(view)
            self.size += len(view)
        while views:
            written = os.writev(self.fd, views[:1024])
            while views and written >= len(views[0]):
                written -= len(views.pop(0))
            if written:
                views[0] = views[0][written:]

    def add(self, digest: str, frame: bytes, plain_length: int) -> int:
        """Append a chunk's frame; returns its offset."""
        offset = self.size
        self._write(frame)
        self.entries.append((digest, offset, len(frame), plain_length))
        return offset

    def add_raw(self, digest: str, data: memoryview) -> tuple[int, int]:
        """Append a chunk as a raw zstd frame, written from `data`; returns offset, length."""
        offset = self.size
        self._writev(raw_frame(data))
        length = self.size - offset
        self.entries.append((digest, offset, length, len(data)))
        return offset, length

    def drain(self) -> None:
        """Until the pieces written so far are hashed (they may be let go then)."""
        if self._hashed is not None:
            self._hashed.result()

    def wait_hashed(self) -> None:
        """As drain(), without raising: a failure is raised by finish()."""
        if self._hashed is not None:
            self._hashed.exception()

    def finish(self) -> PackRecord:
        index = PackIndex(tuple(self.entries)).to_json()
        self._write(struct.pack("<II", SKIPPABLE_MAGIC, len(index) + _TRAILER.size) + index
                    + _TRAILER.pack(len(index), TRAILER_MAGIC))
        os.close(self.fd)
        self.fd = -1
        self.drain()
        digest = "sha256:" + self.hasher.hexdigest()
        os.rename(self.tmp, os.path.join(self.directory, digest.removeprefix("sha256:")))
        return PackRecord(digest, self.size)

    def abandon(self) -> None:
        self.wait_hashed()   # its pieces let go; its failure is not this one's
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            os.unlink(self.tmp)


def _hash(hasher: hashlib._Hash, views: list[memoryview]) -> None:
    try:
        for view in views:
            hasher.update(view)
    finally:
        for view in views:
            view.release()


def read_pack_index(path: str) -> PackIndex:
    """The index at the end of a pack file."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_pack_index_at(fd, path)
    finally:
        os.close(fd)


def read_pack_index_at(fd: int, name: str) -> PackIndex:
    """The index at the end of the pack file open at `fd` (`name` for errors)."""
    size = os.fstat(fd).st_size
    if size < 8 + _TRAILER.size:
        raise ImageError(f"pack {name} is too short to hold its index")
    length, magic = _TRAILER.unpack(os.pread(fd, _TRAILER.size, size - _TRAILER.size))
    start = size - _TRAILER.size - length - 8
    if magic != TRAILER_MAGIC or start < 0:
        raise ImageError(f"pack {name} does not end with a pack index")
    frame_magic, frame_size = struct.unpack("<II", os.pread(fd, 8, start))
    if frame_magic != SKIPPABLE_MAGIC or frame_size != length + _TRAILER.size:
        raise ImageError(f"pack {name}: its index frame is malformed")
    return PackIndex.from_json(os.pread(fd, length, start + 8), start)
