"""Writing a generation's files as chunks in pack blobs (packfile.py), reusing the chunks
already stored.

`write_generation` cuts each file (chunker.py), hashes every chunk (sha256 of its bytes) and
compresses, on worker threads, only the chunks that are not `known` (from the previous
generation's index or from packs already stored); new chunks go into new packs of about
`pack_target` bytes, in the order the files list them (files sorted by name), and the index
refers to old packs by digest. Pack files are named by the hex of their sha256 (as in an OCI
layout's blobs/sha256/). The same files and the same `known` give the same packs and index.
A failed call leaves no temporary file; packs it finished stay (named by content, harmless).

`known_chunks(previous index)` leaves out the chunks of packs that are less than REPACK_BELOW
in use, so they are stored again and long chains do not drag mostly dead packs along.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from torpor.formats.chunk_index import ChunkIndex, Chunking, ChunkRecord, FileRecord, PackRecord, safe_name
from torpor.image.chunker import DEFAULT_PARAMS, ChunkerParams, MappedFile, Span
from torpor.image.packfile import LEVEL, PackWriter, compressor, read_pack_index

PACK_TARGET = 32 << 20       # a pack is closed once it holds this many bytes
REPACK_BELOW = 0.5           # chunks of a pack less than half in use are stored again (bench/chunks.py)


@dataclass(frozen=True)
class ChunkLocation:
    """Where a stored chunk is: its pack (digest, size), its frame there, its plain length."""

    pack: str
    pack_size: int
    offset: int
    length: int
    plain_length: int


@dataclass(frozen=True)
class GenerationStats:
    files: int
    total_bytes: int       # all files' sizes
    zero_bytes: int        # in zero runs: recorded, not stored
    chunks: int            # distinct chunks the generation refers to
    new_chunks: int
    new_bytes: int         # plain bytes of the new chunks
    new_pack_bytes: int    # bytes of the new packs (what must be sent)
    seconds: float


@dataclass(frozen=True)
class WrittenGeneration:
    index: ChunkIndex
    new_packs: tuple[PackRecord, ...]
    stats: GenerationStats


def known_chunks(index: ChunkIndex, repack_below: float = REPACK_BELOW) -> dict[str, ChunkLocation]:
    """The chunks a generation's index refers to, and where they are; without those in packs
    of which less than `repack_below` (a fraction of the pack's bytes) is still in use, so
    that the next generation stores them again and stops referring to the old pack."""
    live = [0] * len(index.packs)
    for c in index.chunks:
        live[c.pack] += c.length
    return {c.digest: ChunkLocation(index.packs[c.pack].digest, index.packs[c.pack].size,
                                    c.offset, c.length, c.plain_length) for c in index.chunks
            if live[c.pack] >= repack_below * index.packs[c.pack].size}


def known_chunks_in_packs(paths: Iterable[str]) -> dict[str, ChunkLocation]:
    """The chunks in pack files (named by their hex digest), from each pack's own index."""
    known: dict[str, ChunkLocation] = {}
    for path in paths:
        size = os.path.getsize(path)
        pack = "sha256:" + os.path.basename(path)
        for digest, offset, length, plain in read_pack_index(path).chunks:
            known.setdefault(digest, ChunkLocation(pack, size, offset, length, plain))
    return known


class _Hasher:
    """The workers' job: a chunk's digest and, unless it is stored already, its frame."""

    def __init__(self, known: Mapping[str, ChunkLocation], level: int) -> None:
        self.known = known
        self.level = level
        self.claimed: set[str] = set()
        self.lock = threading.Lock()
        self.local = threading.local()

    def chunk(self, view: memoryview) -> tuple[str, int, bytes | None]:
        try:
            digest = "sha256:" + hashlib.sha256(view).hexdigest()
            if digest in self.known:
                return digest, len(view), None
            with self.lock:
                first = digest not in self.claimed
                self.claimed.add(digest)
            return digest, len(view), self.compress(view) if first else None
        finally:
            view.release()

    def compress(self, data: memoryview | bytes) -> bytes:
        if not hasattr(self.local, "zstd"):
            self.local.zstd = compressor(self.level)
        frame: bytes = self.local.zstd.compress(data)
        return frame


def _whole_digest(view: memoryview) -> str:
    try:
        return "sha256:" + hashlib.sha256(view).hexdigest()
    finally:
        view.release()


class _Generation:
    """The state of one write_generation call (chunks placed so far, the open pack)."""

    def __init__(self, pack_dir: str, known: Mapping[str, ChunkLocation], pack_target: int,
                 on_pack: Callable[[PackRecord], None] | None = None) -> None:
        self.pack_dir, self.known, self.pack_target = pack_dir, known, pack_target
        self.on_pack = on_pack
        self.placed: dict[str, tuple[int, int, int, int]] = {}  # digest -> slot, offset, len, plain
        self.slots: list[PackRecord | None] = []                # None: the pack being written
        self.slot_of: dict[str, int] = {}
        self.writer: PackWriter | None = None
        self.writer_slot = -1
        self.new_packs: list[PackRecord] = []
        self.new_bytes = 0
        self.new_chunks = 0

    def place(self, digest: str, plain: int, frame: bytes | None, hasher: _Hasher,
              view: memoryview) -> None:
        if digest in self.placed:
            return
        old = self.known.get(digest)
        if old is not None:
            if old.pack not in self.slot_of:
                self.slot_of[old.pack] = len(self.slots)
                self.slots.append(PackRecord(old.pack, old.pack_size))
            self.placed[digest] = (self.slot_of[old.pack], old.offset, old.length, plain)
            return
        if frame is None:  # a duplicate whose first copy was compressed later in the queue
            frame = hasher.compress(view)
        if self.writer is None:
            self.writer = PackWriter(self.pack_dir)
            self.writer_slot = len(self.slots)
            self.slots.append(None)
        offset = self.writer.add(digest, frame, plain)
        self.placed[digest] = (self.writer_slot, offset, len(frame), plain)
        self.new_bytes += plain
        self.new_chunks += 1
        if self.writer.size >= self.pack_target:
            self.close_pack()

    def close_pack(self) -> None:
        if self.writer is not None:
            record = self.writer.finish()
            self.writer = None
            self.slots[self.writer_slot] = record
            self.new_packs.append(record)
            if self.on_pack is not None:
                self.on_pack(record)

    def index(self, chunking: Chunking, files: list[tuple[str, int, str, list[str | int]]]
              ) -> ChunkIndex:
        chunk_no: dict[str, int] = {}
        pack_no: dict[int, int] = {}
        packs: list[PackRecord] = []
        chunks: list[ChunkRecord] = []
        records = []
        for name, size, digest, extents in files:
            numbers = []
            for extent in extents:
                if isinstance(extent, int):
                    numbers.append(extent)
                    continue
                if extent not in chunk_no:
                    slot, offset, length, plain = self.placed[extent]
                    if slot not in pack_no:
                        pack_no[slot] = len(packs)
                        record = self.slots[slot]
                        assert record is not None
                        packs.append(record)
                    chunk_no[extent] = len(chunks)
                    chunks.append(ChunkRecord(extent, pack_no[slot], offset, length, plain))
                numbers.append(chunk_no[extent])
            records.append(FileRecord(name, size, digest, tuple(numbers)))
        return ChunkIndex(chunking, tuple(packs), tuple(chunks), tuple(records))


def write_generation(root: str, names: Iterable[str], pack_dir: str, *,
                     known: Mapping[str, ChunkLocation] | None = None,
                     params: ChunkerParams = DEFAULT_PARAMS, level: int = LEVEL,
                     pack_target: int = PACK_TARGET, workers: int = 0,
                     on_pack: Callable[[PackRecord], None] | None = None) -> WrittenGeneration:
    """Chunk the files `names` (relative to `root`) into new packs under `pack_dir`, storing
    only chunks that are not `known`; returns the generation's index, its new packs, figures.
    `on_pack` hears of each new pack as soon as it is whole (<pack_dir>/<hex of its digest>),
    so that it can be uploaded while the next ones are cut."""
    started = time.monotonic()
    known = known or {}
    workers = workers or os.cpu_count() or 1
    hasher = _Hasher(known, level)
    gen = _Generation(pack_dir, known, pack_target, on_pack)
    files: list[tuple[str, int, str, list[str | int]]] = []
    total = zero = 0
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="torpor-chunks") as pool:
            for name in sorted(set(names)):
                safe_name(name)
                with MappedFile(os.path.join(root, name)) as mapped:
                    extents: list[str | int] = []
                    whole: Future[str] = pool.submit(_whole_digest, mapped.whole())
                    queue: deque[tuple[Future[tuple[str, int, bytes | None]], int, int]] = deque()
                    spans = mapped.spans(params)
                    try:
                        for span in spans:
                            if span.zero:
                                extents.append(-span.length)
                                zero += span.length
                                continue
                            extents.append("")
                            queue.append((pool.submit(hasher.chunk, mapped.view(span)),
                                          len(extents) - 1, span.offset))
                            while len(queue) > 4 * workers or (queue and queue[0][0].done()):
                                _settle(queue.popleft(), extents, gen, hasher, mapped)
                        while queue:
                            _settle(queue.popleft(), extents, gen, hasher, mapped)
                    finally:
                        spans.close()
                        outstanding: list[Future[Any]] = [whole, *(f for f, _, _ in queue)]
                        wait(outstanding)
                    files.append((name, mapped.size, whole.result(), extents))
                    total += mapped.size
        gen.close_pack()
    finally:
        if gen.writer is not None:
            gen.writer.abandon()
    chunking = Chunking(params.min_size, params.avg_size, params.max_size, level)
    index = gen.index(chunking, files)
    stats = GenerationStats(len(files), total, zero, len(index.chunks), gen.new_chunks,
                            gen.new_bytes, sum(p.size for p in gen.new_packs),
                            time.monotonic() - started)
    return WrittenGeneration(index, tuple(gen.new_packs), stats)


def _settle(item: tuple[Future[tuple[str, int, bytes | None]], int, int], extents: list[str | int],
            gen: _Generation, hasher: _Hasher, mapped: MappedFile) -> None:
    future, slot, offset = item
    digest, plain, frame = future.result()
    extents[slot] = digest
    view = mapped.view(Span(offset, plain)) if frame is None else memoryview(b"")
    try:
        gen.place(digest, plain, frame, hasher, view)
    finally:
        view.release()
