"""The chunks of one generation, from this node's packs or the registry, each verified.

A chunk is read from its pack where the pack is on this node (the local store, or a pack the
background fetch has finished), else by one HTTP range request for exactly its frame. Either
way its frame is checked as a full restore checks it (image/reassemble.decode_chunk: length,
content size, sha256) before a byte of it is used. A registry that fails is asked again, with
backoff, until the deadline the caller gives: a lazy restore waits rather than fails, since
the process waiting for the page cannot run on without it. Decoded chunks are kept in a small
cache, since CRIU asks for pages in pieces smaller than a chunk.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import zstandard

from torpor.errors import DeadlineExceeded, DigestMismatch, RegistryError
from torpor.formats.chunk_index import ChunkIndex, ChunkRecord, FileRecord
from torpor.image.reassemble import decode_chunk

LocalPack = Callable[[str, int], str | None]   # a pack's digest, size -> its file here, or None
RemoteRange = Callable[[str, int, int], bytes]  # digest, offset, length -> bytes (unverified)
CACHE_BYTES = 64 << 20
RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass
class Counts:
    local_bytes: int = 0
    remote_bytes: int = 0
    remote_requests: int = 0
    retries: int = 0
    last_error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class ChunkSource:
    def __init__(self, index: ChunkIndex, local: LocalPack, remote: RemoteRange | None,
                 give_up_at: Callable[[], float]) -> None:
        """`give_up_at()`: the monotonic time after which a failing registry is an error."""
        self.index, self._local, self._remote, self._give_up_at = index, local, remote, give_up_at
        self.counts = Counts()
        self._fds: dict[int, int] = {}
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        self._zstd = threading.local()
        self._numbers = {c.digest: n for n, c in enumerate(index.chunks)}
        self._starts: dict[str, list[int]] = {}

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def read(self, record: FileRecord, offset: int, length: int) -> bytes:
        """`length` bytes of the file `record` from `offset`: its chunks and zero runs."""
        starts = self._extent_starts(record)
        out = bytearray()
        at = bisect.bisect_right(starts, offset) - 1
        end = offset + length
        while len(out) < length and at < len(record.extents):
            extent, start = record.extents[at], starts[at]
            size = -extent if extent < 0 else self.index.chunks[extent].plain_length
            lo, hi = max(offset, start), min(end, start + size)
            if lo < hi:
                if extent < 0:
                    out += bytes(hi - lo)
                else:
                    out += memoryview(self.chunk(extent))[lo - start:hi - start]
            at += 1
        if len(out) != length:
            raise DigestMismatch(f"{record.name} ends before byte {end} a lazy restore asked for")
        return bytes(out)

    def chunk(self, number: int) -> bytes:
        with self._lock:
            data = self._cache.get(number)
            if data is not None:
                self._cache.move_to_end(number)
                return data
        record = self.index.chunks[number]
        data = self._fetch(record)
        with self._lock:
            if number not in self._cache:
                self._cache[number] = data
                self._cached += len(data)
                while self._cached > CACHE_BYTES and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._cached -= len(old)
        return data

    def chunk_of(self, record: ChunkRecord) -> bytes:
        return self.chunk(self._numbers[record.digest])

    def _decoder(self) -> zstandard.ZstdDecompressor:
        if not hasattr(self._zstd, "d"):
            self._zstd.d = zstandard.ZstdDecompressor()
        decoder: zstandard.ZstdDecompressor = self._zstd.d
        return decoder

    def _fetch(self, record: ChunkRecord) -> bytes:
        pack = self.index.packs[record.pack]
        fd = self._open_local(record.pack)
        if fd is not None:
            data = decode_chunk(os.pread(fd, record.length, record.offset), record, pack.digest,
                                self._decoder())
            with self.counts.lock:
                self.counts.local_bytes += record.length
            return data
        if self._remote is None:
            raise DigestMismatch(f"pack {pack.digest} is neither on this node nor in a registry")
        delays = iter(RETRY_S)
        while True:
            try:
                frame = self._remote(pack.digest, record.offset, record.length)
                with self.counts.lock:
                    self.counts.remote_bytes += len(frame)
                    self.counts.remote_requests += 1
                return decode_chunk(frame, record, pack.digest, self._decoder())
            except RegistryError as e:
                fd = self._open_local(record.pack)   # the background fetch may have it now
                if fd is not None:
                    return self._fetch(record)
                delay = next(delays, RETRY_S[-1])
                with self.counts.lock:
                    self.counts.retries += 1
                    self.counts.last_error = str(e)
                if time.monotonic() + delay > self._give_up_at():
                    raise DeadlineExceeded(
                        f"the registry did not give chunk {record.digest} of pack "
                        f"{pack.digest} before the lazy restore's deadline: {e}") from None
                time.sleep(delay)

    def _open_local(self, number: int) -> int | None:
        with self._lock:
            fd = self._fds.get(number)
        if fd is not None:
            return fd
        pack = self.index.packs[number]
        path = self._local(pack.digest, pack.size)
        if path is None:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if os.fstat(fd).st_size != pack.size:
            os.close(fd)
            raise DigestMismatch(f"pack {pack.digest} is {os.path.getsize(path)} bytes here, "
                                 f"not the {pack.size} its index says")
        with self._lock:
            if number in self._fds:
                os.close(fd)
                return self._fds[number]
            self._fds[number] = fd
        return fd

    def _extent_starts(self, record: FileRecord) -> list[int]:
        starts = self._starts.get(record.name)
        if starts is None:
            starts, at = [], 0
            for extent in record.extents:
                starts.append(at)
                at += -extent if extent < 0 else self.index.chunks[extent].plain_length
            self._starts[record.name] = starts
        return starts
