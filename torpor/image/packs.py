"""Writing a generation's files as chunks in pack blobs (packfile.py), reusing the chunks
already stored.

`write_generation` cuts each file (chunker.py), hashes every chunk (sha256 of its bytes) and
encodes, on worker threads, only the chunks that are not `known` (from the previous
generation's index or from packs already stored): a zstd frame, or a raw frame for a chunk
that does not compress (packfile.encode). New chunks go into new packs in the order the files
list them (files sorted by name), and the index refers to old packs by digest. Pack files are
named by the hex of their sha256 (as in an OCI layout's blobs/sha256/). The same files and the
same `known` give the same packs and index. A failed call leaves no temporary file; packs it
finished stay (named by content, harmless).

Pack boundaries are content-defined, so that packs converge: two layouts of an unchanged
container, or a generation written without its previous one, share nearly all their packs.
A file of at least `PackSizing.smallest` bytes has packs of its own (the open pack is closed
before its first new chunk and after its last); smaller files share packs. A pack ends after
a chunk whose digest, read as a number, falls below a threshold proportional to the chunk's
frame length, once the pack holds `min` bytes, or when it reaches `max`; so a changed chunk
changes about one pack, and the next boundary is where it was. Sizes follow the file's size
(`PackSizing.of`): about 1/64 of it on average, a power of two within [1 MiB, 32 MiB].

`known_chunks(previous index)` leaves out the chunks of packs that are less than REPACK_BELOW
in use, so they are stored again and long chains do not drag mostly dead packs along.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from torpor.formats.chunk_index import ChunkIndex, Chunking, ChunkRecord, FileRecord, PackRecord, safe_name
from torpor.image.chunker import DEFAULT_PARAMS, ChunkerParams, MappedFile, Span
from torpor.image.follow import Followed
from torpor.image.packfile import LEVEL, RAW, FrameEncoder, PackWriter, read_pack_index

PACK_TARGET = 32 << 20       # the largest average pack (a 2 GiB file and more)
THREADED_BYTES = 64 << 20    # from this many bytes of files, hashing gets threads of its own
REPACK_BELOW = 0.5           # chunks of a pack less than half in use are stored again (bench/chunks.py)


@dataclass(frozen=True)
class PackSizes:
    """A pack ends after a boundary chunk once it holds `min` bytes, or at `max` bytes."""

    min: int
    avg: int
    max: int

    def ends_pack(self, digest: str, length: int) -> bool:
        """Whether a chunk (frame of `length` bytes) is a boundary: chance length/(avg-min),
        so packs hold `avg` bytes on average."""
        return int(digest[7:23], 16) < (length << 64) // (self.avg - self.min)


@dataclass(frozen=True)
class PackSizing:
    """Pack sizes by file size: average 1/`per_file` of the file, rounded down to a power of
    two, within [smallest, largest]; min avg/4, max 4*avg. Files under `smallest` share packs
    of the smallest sizes. Coarse steps, so that files of about the same size pack alike."""

    smallest: int = 1 << 20
    largest: int = PACK_TARGET
    per_file: int = 64

    def of(self, file_size: int) -> PackSizes:
        avg = 1 << max(0, (file_size // self.per_file).bit_length() - 1)
        avg = min(self.largest, max(self.smallest, avg))
        return PackSizes(avg // 4, avg, 4 * avg)

    @property
    def settled(self) -> int:
        """From this file size on, the sizes are the largest: a file still growing past it
        packs as it will once whole (2 GiB by default)."""
        return self.largest * self.per_file


DEFAULT_SIZING = PackSizing()


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
    followed_bytes: int = 0   # of chunks cut and hashed while CRIU wrote them (follow.py)
    early_bytes: int = 0      # of files packed while CRIU wrote them (EarlyFile)


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
        self.claimed: set[str] = set()
        self.lock = threading.Lock()
        self.encoder = FrameEncoder(level)

    def chunk(self, view: memoryview) -> tuple[str, int, bytes | None]:
        """(digest, length, its frame or RAW, or None when known or encoded by another)."""
        try:
            return self._claim(view, "sha256:" + hashlib.sha256(view).hexdigest(), None)
        finally:
            view.release()

    def followed(self, view: memoryview, digest: str,
                 frame: bytes | None) -> tuple[str, int, bytes | None]:
        """As `chunk`, for a chunk the follower hashed: its frame (or RAW) if it made one."""
        try:
            return self._claim(view, digest, frame)
        finally:
            view.release()

    def _claim(self, view: memoryview, digest: str,
               frame: bytes | None) -> tuple[str, int, bytes | None]:
        if digest in self.known:
            return digest, len(view), None
        with self.lock:
            first = digest not in self.claimed
            self.claimed.add(digest)
        if not first:
            return digest, len(view), None
        return digest, len(view), frame if frame is not None else self.encode(view)

    def encode(self, data: memoryview) -> bytes:
        """The chunk's zstd frame, or RAW."""
        return self.encoder.frame(data)


class _Generation:
    """The state of one write_generation call (chunks placed so far, the open pack)."""

    def __init__(self, pack_dir: str, known: Mapping[str, ChunkLocation], sizing: PackSizing,
                 on_pack: Callable[[PackRecord], None] | None = None,
                 hashing: Executor | None = None) -> None:
        self.pack_dir, self.known, self.sizing = pack_dir, known, sizing
        self.on_pack, self.hashing = on_pack, hashing
        self.sizes = sizing.of(0)
        self.own = False          # the file being placed has packs of its own
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
        if frame is None:  # a duplicate whose first copy was encoded later in the queue
            frame = hasher.encode(view)
        if self.writer is None:
            self.writer = PackWriter(self.pack_dir, self.hashing)
            self.writer_slot = len(self.slots)
            self.slots.append(None)
        if frame == RAW:
            offset, length = self.writer.add_raw(digest, view)
        else:
            offset, length = self.writer.add(digest, frame, plain), len(frame)
        self.placed[digest] = (self.writer_slot, offset, length, plain)
        self.new_bytes += plain
        self.new_chunks += 1
        size = self.writer.size
        if size >= self.sizes.max or (size >= self.sizes.min
                                      and self.sizes.ends_pack(digest, length)):
            self.close_pack()

    def begin_file_from(self, early: EarlyFile, size: int) -> int:
        """Begin the next file, of `size` bytes, with what `early` packed of it, as if placed
        here, and return the offset the file goes on from: all of it, where placing it here
        gives the same (the same pack directory, `known`, sizes and level, none of its new
        chunks placed already, by an earlier file); else its packs closed before the first
        chunk an earlier file holds (0: nothing taken)."""
        self.begin_file(size)
        same_known = early.known is self.known or not (early.known or self.known)
        if (early.gen.pack_dir != self.pack_dir or not same_known
                or early.gen.sizes != self.sizing.of(size) or size < early.gen.sizing.settled
                or early.gen.sizing != self.sizing):
            return 0
        first = next((n for n, digest in enumerate(early.new) if digest in self.placed), -1)
        whole = first < 0
        if whole:
            mark = _Mark(early.end, len(early.new), early.gen.new_bytes, early.gen.new_chunks)
            packs = len(early.gen.new_packs)
        else:
            packs = sum(1 for m in early.marks if m.new <= first)
            if not packs:
                return 0
            mark = early.marks[packs - 1]
        left = set(early.new[mark.new:])   # placed in packs not taken
        old = {slot: pack for pack, slot in early.gen.slot_of.items()}
        slots = []
        for slot, record in enumerate(early.gen.slots):
            if slot in old:   # a previous generation's pack
                if old[slot] not in self.slot_of:
                    self.slot_of[old[slot]] = len(self.slots)
                    self.slots.append(record)
                slots.append(self.slot_of[old[slot]])
            else:   # (one not taken is never referred to: none of its chunks are placed)
                slots.append(len(self.slots))
                self.slots.append(record)
        for digest, (slot, offset, length, plain) in early.gen.placed.items():
            if digest not in left:
                self.placed.setdefault(digest, (slots[slot], offset, length, plain))
        if whole and early.gen.writer is not None:
            self.writer, self.writer_slot = early.gen.writer, slots[early.gen.writer_slot]
            early.gen.writer = None
        self.new_packs.extend(early.gen.new_packs[:packs])
        self.new_bytes += mark.new_bytes
        self.new_chunks += mark.new_chunks
        return mark.end

    def begin_file(self, size: int) -> None:
        """A file of `size` bytes comes next: one with packs of its own closes the open pack
        (and the next file closes its last)."""
        own = size >= self.sizing.smallest
        if own or self.own:
            self.close_pack()
        self.own = own
        self.sizes = self.sizing.of(size if own else 0)

    def close_pack(self) -> None:
        if self.writer is not None:
            record = self.writer.finish()
            self.writer = None
            self.slots[self.writer_slot] = record
            self.new_packs.append(record)
            if self.on_pack is not None:
                self.on_pack(record)

    def index(self, chunking: Chunking, files: list[tuple[str, int, list[str | int]]]
              ) -> ChunkIndex:
        chunk_no: dict[str, int] = {}
        pack_no: dict[int, int] = {}
        packs: list[PackRecord] = []
        chunks: list[ChunkRecord] = []
        records = []
        for name, size, extents in files:
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
            records.append(FileRecord(name, size, tuple(numbers)))
        return ChunkIndex(chunking, tuple(packs), tuple(chunks), tuple(records))


@dataclass(frozen=True)
class _Mark:
    """Where an EarlyFile stood when one of its packs closed: the file's offset, how many new
    chunks it had placed, their plain bytes."""

    end: int
    new: int
    new_bytes: int
    new_chunks: int


class EarlyFile:
    """A big file's chunks packed from its start before write_generation reaches it: while
    CRIU still writes it, beside the DumpFollower (early_packs.py), so that its packs can be
    sent before the dump is over. Once the file has passed `sizing.settled` its pack sizes are
    final, so its chunks are placed here as write_generation would place them, in packs of its
    own; write_generation takes them (`_Generation.begin_file_from`): all of them where no
    earlier file holds any of its new chunks, else those closed before the first it holds,
    and packs the rest of the file itself (the packs not taken are left unused). Either way
    the generation is the one written without."""

    def __init__(self, pack_dir: str, known: Mapping[str, ChunkLocation], sizing: PackSizing,
                 level: int, on_pack: Callable[[PackRecord], None] | None = None) -> None:
        self.known, self.level = known, level
        self.gen = _Generation(pack_dir, known, sizing, on_pack)
        self.gen.begin_file(sizing.settled)
        self.hasher = _Hasher(known, level)
        self.end = 0                  # the file's bytes placed so far, from its start
        self.new: list[str] = []      # the chunks placed as new (not `known`)
        self.marks: list[_Mark] = []  # one per closed pack

    def place(self, span: Span, digest: str, frame: bytes | None, data: memoryview) -> None:
        """The next span of the file: a chunk, with its frame (RAW, or None to encode) and its
        bytes (needed for RAW or None), or a zero run (nothing stored)."""
        self.end = span.offset + span.length
        if not span.zero:
            before = self.gen.new_chunks
            self.gen.place(digest, span.length, frame, self.hasher, data)
            if self.gen.new_chunks != before:
                self.new.append(digest)
            if len(self.gen.new_packs) != len(self.marks):
                self.marks.append(_Mark(self.end, len(self.new), self.gen.new_bytes,
                                        self.gen.new_chunks))

    @property
    def packed_bytes(self) -> int:
        """Bytes of its packs closed so far."""
        return sum(p.size for p in self.gen.new_packs)

    def abandon(self) -> None:
        """Its open pack's temporary file removed (closed packs stay, named by content)."""
        if self.gen.writer is not None:
            self.gen.writer.abandon()
            self.gen.writer = None


def write_generation(root: str, names: Iterable[str], pack_dir: str, *,
                     known: Mapping[str, ChunkLocation] | None = None,
                     params: ChunkerParams = DEFAULT_PARAMS, level: int = LEVEL,
                     sizing: PackSizing = DEFAULT_SIZING, workers: int = 0,
                     on_pack: Callable[[PackRecord], None] | None = None,
                     followed: Followed | None = None,
                     early: Mapping[str, EarlyFile] | None = None) -> WrittenGeneration:
    """Chunk the files `names` (relative to `root`) into new packs under `pack_dir`, storing
    only chunks that are not `known`; returns the generation's index, its new packs, figures.
    `sizing` says how big packs are (PackSizing).
    `on_pack` hears of each new pack as soon as it is whole (<pack_dir>/<hex of its digest>),
    so that it can be uploaded while the next ones are cut.
    `followed`: the chunks a DumpFollower cut and hashed as CRIU wrote (follow.py), taken
    instead of cutting and hashing them again; `early`, by name, what was packed of big files
    during the dump (EarlyFile), taken where it is what packing them here gives, with the
    follower's chunks for them. The result is the same without either."""
    started = time.monotonic()
    known = known or {}
    workers = workers or os.cpu_count() or 1
    hasher = _Hasher(known, level)
    ordered = [safe_name(name) for name in sorted(set(names))]
    big = sum(os.stat(os.path.join(root, name), follow_symlinks=False).st_size
              for name in ordered) >= THREADED_BYTES
    # for large files, the packs' sha256 on a thread of its own, beside the cutting and the writes
    hashing = ThreadPoolExecutor(1, thread_name_prefix="torpor-pack-hash") if big else None
    gen = _Generation(pack_dir, known, sizing, on_pack, hashing)
    files: list[tuple[str, int, list[str | int]]] = []
    total = zero = from_follower = early_bytes = 0
    if followed is not None and followed.params != params:
        followed = None   # cut otherwise: its chunks are not this generation's
    frames = followed is not None and followed.level == level
    try:
        with contextlib.ExitStack() as threads:
            pool = threads.enter_context(ThreadPoolExecutor(workers,
                                                            thread_name_prefix="torpor-chunks"))
            if hashing is not None:
                threads.enter_context(hashing)
            for name in ordered:
                with MappedFile(os.path.join(root, name)) as mapped:
                    extents: list[str | int] = []
                    queue: deque[tuple[Future[tuple[str, int, bytes | None]], int, int]] = deque()
                    ahead = followed.files.get(name) if followed is not None else None
                    resumed = ahead.spans_of(mapped, params) if ahead is not None else None
                    if resumed is None:   # not the file it followed: nothing of it is taken
                        ahead = None
                    packed = early.get(name) if early is not None and ahead is not None else None
                    if packed is not None and packed.level == level:
                        packed_end = gen.begin_file_from(packed, mapped.size)
                        hasher.claimed.update(d for d in packed.new if d in gen.placed)
                        early_bytes += packed_end
                    else:
                        packed_end = 0
                        gen.begin_file(mapped.size)
                    spans = resumed if resumed is not None else mapped.spans(params)
                    try:
                        for span in spans:
                            if span.zero:
                                extents.append(-span.length)
                                zero += span.length
                                continue
                            if span.offset < packed_end:   # placed by the early packer
                                assert ahead is not None
                                found = ahead.chunk(span)
                                assert found is not None, (name, span)
                                extents.append(found[0])
                                from_follower += span.length
                                continue
                            extents.append("")
                            found = ahead.chunk(span) if ahead is not None else None
                            if found is None:
                                job = pool.submit(hasher.chunk, mapped.view(span))
                            else:
                                from_follower += span.length
                                job = _followed_job(pool, hasher, mapped.view(span), found[0],
                                                    found[1] if frames else None)
                            queue.append((job, len(extents) - 1, span.offset))
                            while len(queue) > 4 * workers or (queue and queue[0][0].done()):
                                _settle(queue.popleft(), extents, gen, hasher, mapped)
                        while queue:
                            _settle(queue.popleft(), extents, gen, hasher, mapped)
                    finally:
                        spans.close()
                        wait([f for f, _, _ in queue])
                        if gen.writer is not None:   # its pieces of this file hashed
                            gen.writer.wait_hashed()
                    files.append((name, mapped.size, extents))
                    total += mapped.size
            gen.close_pack()
    finally:
        if gen.writer is not None:
            gen.writer.abandon()
    chunking = Chunking(params.min_size, params.avg_size, params.max_size, level)
    index = gen.index(chunking, files)
    stats = GenerationStats(len(files), total, zero, len(index.chunks), gen.new_chunks,
                            gen.new_bytes, sum(p.size for p in gen.new_packs),
                            time.monotonic() - started, from_follower, early_bytes)
    return WrittenGeneration(index, tuple(gen.new_packs), stats)


def _followed_job(pool: Executor, hasher: _Hasher, view: memoryview, digest: str,
                  frame: bytes | None) -> Future[tuple[str, int, bytes | None]]:
    """A followed chunk's answer: at once when the follower made its frame (or found it raw),
    else encoded on a worker."""
    if frame is None:
        return pool.submit(hasher.followed, view, digest, None)
    done: Future[tuple[str, int, bytes | None]] = Future()
    done.set_result(hasher.followed(view, digest, frame))
    return done


def _settle(item: tuple[Future[tuple[str, int, bytes | None]], int, int], extents: list[str | int],
            gen: _Generation, hasher: _Hasher, mapped: MappedFile) -> None:
    future, slot, offset = item
    digest, plain, frame = future.result()
    extents[slot] = digest
    view = mapped.view(Span(offset, plain)) if not frame else memoryview(b"")  # None or RAW
    try:
        gen.place(digest, plain, frame, hasher, view)
    finally:
        view.release()
