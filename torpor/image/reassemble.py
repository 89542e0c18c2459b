"""Rebuilding a generation's files from its chunk index and pack blobs, trusting neither.

Before anything is written, the index is held to `RestoreLimits` (files, sizes, chunks,
packs), so a hostile index cannot fill the disk, and every pack it names must be present
with the size it says. Each file is created 0600 (O_EXCL, no links followed), sized with
ftruncate so that zero runs stay holes where the filesystem allows (and read back as zeros
where it does not), and its chunks are written at their offsets. Every chunk is checked as
it is decompressed (frame size, content size, sha256 of the bytes; not the sha256 where this
restore has just downloaded the pack and checked its digest whole, and the pack's own index,
which that digest covers, lists the chunk where the chunk index does: `decode_chunk`'s
`vouched`); a mismatch is DigestMismatch naming the pack. A file is its chunks and zero runs
in the order the index (digest-checked itself) lists them, so its bytes are checked once;
its length must come out as the index says. (The file's own sha256 in the index is not
computed again: that was a second pass over every byte, the slowest step of a restore.)
Chunks are read and decompressed on worker threads (zstd and sha256 release the GIL), several
files at once; a chunk stored raw (packfile.raw_content) is hashed straight from the frame
read and its blocks joined, without a decompressor (one pwrite of the joined bytes was
measured faster on tmpfs than a pwritev of the blocks in place).
On any failure, the files and directories this call created are removed.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import zstandard

from torpor.errors import DigestMismatch, ImageError
from torpor.formats.chunk_index import ChunkIndex, ChunkRecord, FileRecord
from torpor.image.packfile import raw_content, read_pack_index_at
from torpor.registry.arrivals import Arrivals

PackPath = Callable[[str], str]
_IN_FLIGHT_BYTES = 32 << 20   # per file being rebuilt


@dataclass(frozen=True)
class RestoreLimits:
    """What a restore accepts from an index; the caller may lower max_total_size to the
    free space of the target filesystem."""

    max_files: int = 100_000
    max_file_size: int = 1 << 40     # 1 TiB
    max_total_size: int = 2 << 40    # all files together, zero runs included
    max_chunks: int = 1 << 24
    max_chunk_size: int = 16 << 20   # plain; torpor writes at most 1 MiB
    max_packs: int = 1 << 16
    max_pack_size: int = 1 << 30     # torpor writes at most 128 MiB (packs.py)


def check_limits(index: ChunkIndex, limits: RestoreLimits) -> None:
    """ImageError listing every limit the index is over."""
    over = []
    if len(index.files) > limits.max_files:
        over.append(f"{len(index.files)} files (limit {limits.max_files})")
    big = [f.name for f in index.files if f.size > limits.max_file_size]
    if big:
        over.append(f"files over {limits.max_file_size} bytes: {', '.join(big[:5])}")
    total = sum(f.size for f in index.files)
    if total > limits.max_total_size:
        over.append(f"{total} bytes of files (limit {limits.max_total_size})")
    if len(index.chunks) > limits.max_chunks:
        over.append(f"{len(index.chunks)} chunks (limit {limits.max_chunks})")
    if any(c.plain_length > limits.max_chunk_size or c.length > limits.max_chunk_size + 65536
           for c in index.chunks):
        over.append(f"chunks over {limits.max_chunk_size} bytes")
    if len(index.packs) > limits.max_packs:
        over.append(f"{len(index.packs)} packs (limit {limits.max_packs})")
    if any(p.size > limits.max_pack_size for p in index.packs):
        over.append(f"packs over {limits.max_pack_size} bytes")
    if over:
        raise ImageError("the chunk index is over this node's limits: " + "; ".join(over))


def needed_packs(index: ChunkIndex, have: Collection[str]) -> list[str]:
    """The digests of the packs the index refers to that are not in `have`, in index order."""
    return [p.digest for p in index.packs if p.digest not in have]


def packs_in(directory: str) -> PackPath:
    """Packs stored as `directory`/<hex of their sha256> (an OCI layout's blobs/sha256)."""
    return lambda digest: os.path.join(directory, digest.removeprefix("sha256:"))


@dataclass(frozen=True)
class RebuiltFiles:
    paths: tuple[str, ...]
    bytes_written: int   # chunk bytes written (zero runs are holes)


class _Packs:
    """Open pack files, checked against the index's sizes; chunks read back verified."""

    def __init__(self, index: ChunkIndex, pack_path: PackPath) -> None:
        self.index = index
        missing = [p.digest for p in index.packs if not os.path.isfile(pack_path(p.digest))]
        if missing:
            raise ImageError(f"{len(missing)} pack(s) of the chunk index are missing: "
                             f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
                             " (fetch them first: needed_packs)")
        self.fds: list[int] = []
        try:
            for pack in index.packs:
                fd = os.open(pack_path(pack.digest), os.O_RDONLY | os.O_CLOEXEC)
                self.fds.append(fd)
                size = os.fstat(fd).st_size
                if size != pack.size:
                    raise DigestMismatch(f"pack {pack.digest} is {size} bytes, not the "
                                         f"{pack.size} its index says")
        except BaseException:
            self.close()
            raise
        self.local = threading.local()

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def chunk(self, chunk: ChunkRecord) -> bytes:
        pack = self.index.packs[chunk.pack].digest
        frame = os.pread(self.fds[chunk.pack], chunk.length, chunk.offset)
        if not hasattr(self.local, "zstd"):
            self.local.zstd = zstandard.ZstdDecompressor()
        return decode_chunk(frame, chunk, pack, self.local.zstd)


class _ArrivingPacks:
    """Packs that a download beside the rebuild is still bringing (registry/arrivals.py): each
    opened, and its size checked, when its first chunk is needed and it is in place. A pack
    the download checked whole (not one the store held already) has its chunks' sha256 not
    computed again where its own index vouches for them (`vouched_chunks`)."""

    def __init__(self, index: ChunkIndex, pack_path: PackPath, arrivals: Arrivals) -> None:
        self.index = index
        self.pack_path = pack_path
        self.arrivals = arrivals
        self.fds: dict[int, int] = {}
        self.vouched: dict[int, Vouched | None] = {}
        self.lock = threading.Lock()
        self.closed = False
        self.local = threading.local()

    def _fd(self, number: int) -> int:
        fd = self.fds.get(number)
        if fd is not None:
            return fd
        pack = self.index.packs[number]
        self.arrivals.wait(pack.digest)      # outside the lock: other packs may be in already
        with self.lock:
            fd = self.fds.get(number)
            if fd is None:
                if self.closed:
                    raise ImageError("the rebuild has ended")
                checked = self.arrivals.checked(pack.digest)   # of the file opened next
                fd = os.open(self.pack_path(pack.digest), os.O_RDONLY | os.O_CLOEXEC)
                try:
                    size = os.fstat(fd).st_size
                    if size != pack.size:
                        raise DigestMismatch(f"pack {pack.digest} is {size} bytes, not the "
                                             f"{pack.size} its index says")
                    self.vouched[number] = vouched_chunks(fd, pack.digest) if checked else None
                except BaseException:
                    os.close(fd)
                    raise
                self.fds[number] = fd
            return fd

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for fd in self.fds.values():
                os.close(fd)
            self.fds = {}

    def chunk(self, chunk: ChunkRecord) -> bytes:
        pack = self.index.packs[chunk.pack].digest
        frame = os.pread(self._fd(chunk.pack), chunk.length, chunk.offset)
        if not hasattr(self.local, "zstd"):
            self.local.zstd = zstandard.ZstdDecompressor()
        return decode_chunk(frame, chunk, pack, self.local.zstd, self.vouched[chunk.pack])


Vouched = Collection[tuple[str, int, int, int]]   # a pack's own index: digest, offset, length, plain


def vouched_chunks(fd: int, name: str) -> Vouched | None:
    """The chunks the pack open at `fd` lists in its own index (the frame torpor wrote at each
    offset, each hashed as it was written), for a pack whose digest this restore has just
    checked whole: the digest vouches for that index. None when it has none to read (its
    chunks are then hashed)."""
    try:
        return frozenset(read_pack_index_at(fd, name).chunks)
    except (ImageError, ValueError, struct.error, OSError):
        return None


def decode_chunk(frame: bytes | memoryview, chunk: ChunkRecord, pack: str,
                 zstd: zstandard.ZstdDecompressor, vouched: Vouched | None = None) -> bytes:
    """A chunk's bytes from its frame as read from `pack`, checked: frame length, content size,
    sha256; DigestMismatch naming the pack otherwise. `vouched`: the pack's own index, its
    digest checked whole by this restore (`vouched_chunks`); a chunk it lists at exactly this
    offset, length and size is the frame torpor wrote and hashed there, so its sha256 is not
    computed again (a record pointing anywhere else is hashed as any)."""
    if len(frame) != chunk.length:
        raise DigestMismatch(f"pack {pack} ends inside chunk {chunk.digest}")
    pack_checked = vouched is not None and \
        (chunk.digest, chunk.offset, chunk.length, chunk.plain_length) in vouched
    raw = raw_content(frame, chunk.plain_length)
    if raw is not None:
        if not pack_checked:
            hasher = hashlib.sha256()
            for piece in raw:
                hasher.update(piece)
            if "sha256:" + hasher.hexdigest() != chunk.digest:
                raise DigestMismatch(f"pack {pack}: chunk at offset {chunk.offset} does not "
                                     f"match its digest {chunk.digest} (the pack is damaged)")
        return b"".join(raw)
    try:
        if zstandard.frame_content_size(frame) != chunk.plain_length:
            raise DigestMismatch(f"pack {pack}: chunk {chunk.digest} at offset "
                                 f"{chunk.offset} does not have the length its index says")
        data: bytes = zstd.decompress(frame, max_output_size=chunk.plain_length)
    except zstandard.ZstdError as e:
        raise DigestMismatch(f"pack {pack}: chunk {chunk.digest} at offset {chunk.offset} "
                             f"does not match its digest (the pack is damaged: {e})") from None
    if len(data) != chunk.plain_length or (
            not pack_checked and "sha256:" + hashlib.sha256(data).hexdigest() != chunk.digest):
        raise DigestMismatch(f"pack {pack}: chunk at offset {chunk.offset} does not match "
                             f"its digest {chunk.digest} (the pack is damaged)")
    return data


ChunkGetter = Callable[[ChunkRecord], bytes]   # a chunk's bytes, verified
Ranges = Callable[[FileRecord], list[tuple[int, int]] | None]


def rebuild(index: ChunkIndex, pack_path: PackPath | None, target: str, *,
            limits: RestoreLimits | None = None, workers: int = 0,
            chunks: ChunkGetter | None = None, ranges: Ranges | None = None,
            arrivals: Arrivals | None = None) -> RebuiltFiles:
    """Write every file of `index` under the directory `target` from the packs `pack_path`
    finds (or the verified chunks `chunks` gives); the files must not exist yet. `ranges`:
    for a file, the (offset, length) ranges to fill, the rest left a hole (a lazy restore's
    page files: lazy/); None fills it all. `arrivals`: the packs are still arriving, each
    waited for when first needed (a download beside the rebuild)."""
    check_limits(index, limits or RestoreLimits())
    workers = workers or os.cpu_count() or 1
    packs: _Packs | _Given | _ArrivingPacks
    if chunks is not None:
        packs = _Given(chunks)
    elif pack_path is not None and arrivals is not None:
        packs = _ArrivingPacks(index, pack_path, arrivals)
    elif pack_path is not None:
        packs = _Packs(index, pack_path)
    else:
        raise ValueError("rebuild needs pack_path or chunks")
    created: list[str] = []
    failed = threading.Event()
    fds: list[int] = []
    try:
        for record in index.files:
            fds.append(_create(target, record, created))
        jobs, fds = list(zip(index.files, fds, strict=True)), []  # the workers close them now
        file_workers = max(1, min(len(jobs), 4))
        with ThreadPoolExecutor(workers, thread_name_prefix="torpor-unpack") as chunk_pool, \
                ThreadPoolExecutor(file_workers, thread_name_prefix="torpor-files") as file_pool:
            futures = [file_pool.submit(_rebuild_file, index, packs, chunk_pool, record, fd,
                                        2 * workers, failed, ranges(record) if ranges else None)
                       for record, fd in jobs]
            written = 0
            for future in futures:
                try:
                    written += future.result()
                except BaseException as e:
                    failed.set()
                    if arrivals is not None:   # its workers waiting for packs wake, now
                        arrivals.cancel(e)
                    raise
        return RebuiltFiles(tuple(os.path.join(target, f.name) for f in index.files), written)
    except BaseException as e:
        failed.set()
        if arrivals is not None:
            arrivals.cancel(e)
        for fd in fds:
            os.close(fd)
        for path in reversed(created):
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)
            except OSError:
                pass
        raise
    finally:
        packs.close()


def verify_chunks(index: ChunkIndex, pack_path: PackPath, *, workers: int = 0) -> None:
    """Read every chunk of `index` back from its pack and check it as a rebuild does (frame,
    length, sha256); DigestMismatch at the first that is not what the index says."""
    check_limits(index, RestoreLimits())
    packs = _Packs(index, pack_path)
    by_pack: dict[int, list[ChunkRecord]] = {}
    for chunk in index.chunks:
        by_pack.setdefault(chunk.pack, []).append(chunk)

    def check(records: list[ChunkRecord]) -> None:
        for record in records:
            packs.chunk(record)

    try:
        with ThreadPoolExecutor(workers or os.cpu_count() or 1,
                                thread_name_prefix="torpor-verify") as pool:
            for future in [pool.submit(check, records) for records in by_pack.values()]:
                future.result()
    finally:
        packs.close()


def _create(target: str, record: FileRecord, created: list[str]) -> int:
    """The file's descriptor, sized; parents created 0700. Recorded in `created`."""
    parts = record.name.split("/")
    path = target
    for part in parts[:-1]:
        path = os.path.join(path, part)
        try:
            os.mkdir(path, 0o700)
            created.append(path)
        except FileExistsError:
            if os.path.islink(path) or not os.path.isdir(path):
                raise ImageError(f"cannot rebuild {record.name}: {path} is not a directory") from None
    path = os.path.join(path, parts[-1])
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise ImageError(f"cannot rebuild {record.name}: {path} exists already") from None
    created.append(path)
    try:
        os.ftruncate(fd, record.size)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Given:
    def __init__(self, chunks: ChunkGetter) -> None:
        self.chunk = chunks

    def close(self) -> None:
        pass


def _wanted(ranges: list[tuple[int, int]] | None, start: int, length: int) -> bool:
    return ranges is None or any(at < start + length and start < at + n for at, n in ranges)


def _rebuild_file(index: ChunkIndex, packs: _Packs | _Given | _ArrivingPacks,
                  pool: ThreadPoolExecutor,
                  record: FileRecord, fd: int, window: int, failed: threading.Event,
                  ranges: list[tuple[int, int]] | None = None) -> int:
    """Write one file's chunks (those overlapping `ranges`); returns the chunk bytes written."""
    queue: deque[tuple[Future[bytes], int]] = deque()
    queued = written = offset = 0

    def settle() -> None:
        nonlocal queued, written
        future, at = queue.popleft()
        data = future.result()
        queued -= len(data)
        view = memoryview(data)
        while view:
            view = view[os.pwrite(fd, view, at + len(data) - len(view)):]
        written += len(data)

    try:
        for extent in record.extents:
            if failed.is_set():
                raise ImageError("rebuild stopped: another file failed")
            if extent < 0:  # a zero run: a hole, as ftruncate left it
                offset -= extent
                continue
            chunk = index.chunks[extent]
            if not _wanted(ranges, offset, chunk.plain_length):
                offset += chunk.plain_length
                continue
            queue.append((pool.submit(packs.chunk, chunk), offset))
            queued += chunk.plain_length
            offset += chunk.plain_length
            while len(queue) > window or queued > _IN_FLIGHT_BYTES:
                settle()
        while queue:
            settle()
    finally:
        for future, _ in queue:
            future.cancel()
        os.close(fd)
    if offset != record.size:
        raise ImageError(f"{record.name}: its chunks and zero runs make {offset} bytes, not the "
                         f"{record.size} the index says")
    return written
