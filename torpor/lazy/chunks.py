"""The chunks of one generation, from this node's packs or the registry, each verified.

A chunk is read from its pack where the pack is on this node (any image in the local store
that holds it), else by an HTTP range request on its pack in the registry: one request for a
run of chunks that lie back to back in one pack (up to RUN_BYTES), several runs at once.
Either way each frame is checked as a full restore checks it (image/reassemble.decode_chunk:
length, content size, sha256) before a byte of it is used, but for the sha256 of a chunk
whose whole pack the download below has checked. Behind each read, the next bytes of the
same file are fetched in the background, on the fetchers (CRIU asks in address order, one
request at a time): READ_AHEAD by range requests, AHEAD_AT_HAND from packs at hand, whose
chunks are then hashed while CRIU places the pages before them (a window of 64 MiB there
slowed the restore itself, before the workload ran, on two cores).
A registry that fails is asked again, with backoff, until the deadline the caller gives: a
lazy restore waits rather than fails, since the process waiting for the page cannot run on
without it. Decoded chunks are kept in a cache of CACHE_BYTES.

Once the packs are downloading whole behind the workload (`follow`, registry/arrivals.py),
that download is the read-ahead. CRIU's background transfer waits, in the page server's
thread, for its pack to be whole and its digest checked, as long as the download moves (a
download that writes nothing for a second is passed by a range request), and its chunks are
then not hashed again where the pack's own index vouches for them (decode_chunk's
`vouched`). Such a pack stays open, and a chunk of it stored raw (memory that did not
compress) is answered as where its bytes lie in the file (checked.py), for the page server
to send from the page cache (pieces.py) without reading them into torpor. A page fault (a
request of less than URGENT_BYTES) does not wait: its chunk is read from the pack's file if
the download has written it (then checked against its own sha256, as a range's), else by a
range request at once. CRIU reads the answers in the order it asked, so a fault's answer can
still wait behind a background one. Once the download has ended (or failed), ranges and the
read-ahead bring what is missing, as without it. `ready` says whether a read would answer at
once, so the page server can answer it on its own thread.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import zstandard

from torpor.errors import DeadlineExceeded, DigestMismatch, ImageError, RegistryError
from torpor.formats.chunk_index import ChunkIndex, ChunkRecord, FileRecord
from torpor.image.reassemble import Vouched, decode_chunk, vouched_chunks
from torpor.lazy.checked import CheckedPack, InPack
from torpor.lazy.pieces import OpenFile, Piece
from torpor.registry.arrivals import Arrivals

LocalPack = Callable[[str, int], str | None]   # a pack's digest, size -> its file here, or None
RemoteRange = Callable[[str, int, int], bytes | bytearray]  # digest, offset, length (unverified)
CACHE_BYTES = 128 << 20
RUN_BYTES = 8 << 20       # one range request at most
READ_AHEAD = 64 << 20     # fetched behind each read, of the same file, by range requests
AHEAD_AT_HAND = 16 << 20  # ... or from packs at hand (each chunk hashed on a fetcher)
FETCHERS = 6
KEPT_PACKS = 64           # checked packs kept open (each also while a chunk of it is cached)
WAIT_S = 600.0            # the most a request waits for the download before asking by range
STALL_S = 1.0             # ... or once the download has written nothing for this long
PACK_STALL_S = 10.0       # ... or the pack's own download nothing, while others move
URGENT_BYTES = 64 << 10   # less is a page fault (CRIU asks for one page); more, its background
RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)


Chunk = bytes | InPack


@dataclass
class Counts:
    local_bytes: int = 0
    remote_bytes: int = 0      # by range requests
    streamed_bytes: int = 0    # read from the packs' download, as it came
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class ChunkSource:
    def __init__(self, index: ChunkIndex, local: LocalPack, remote: RemoteRange | None,
                 give_up_at: Callable[[], float]) -> None:
        """`give_up_at()`: the monotonic time after which a failing registry is an error."""
        self.index, self._local, self._remote, self._give_up_at = index, local, remote, give_up_at
        self.counts = Counts()
        self._fds: dict[int, int] = {}
        self._cache: OrderedDict[int, Chunk] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        self._zstd = threading.local()
        self._numbers = {c.digest: n for n, c in enumerate(index.chunks)}
        self._pending: dict[int, Future[None]] = {}
        self._pool = ThreadPoolExecutor(FETCHERS, thread_name_prefix="torpor-chunks")
        self._starts: dict[str, list[int]] = {}
        self._arrivals: Arrivals | None = None
        self._checked: OrderedDict[int, CheckedPack] = OrderedDict()  # brought, checked: open
        self._not_local: set[int] = set()                # packs the store does not hold
        self._closed = False

    def follow(self, arrivals: Arrivals) -> None:
        """Read the packs not on this node from their download as it comes (`arrivals`)."""
        self._arrivals = arrivals

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)  # a retrying one ends alone
        with self._lock:
            self._closed = True   # a read ahead still running opens no pack from now on
            fds, self._fds = self._fds, {}
            self._checked.clear()   # each closes once no piece still being sent names it
            self._cache.clear()
        for fd in fds.values():
            os.close(fd)

    def read(self, record: FileRecord, offset: int, length: int) -> list[Piece]:
        """`length` bytes of the file `record` from `offset` (its chunks and zero runs), as
        the pieces to send one after the other (no copy of the chunks; a raw chunk of a pack
        checked whole, as the ranges of the pack's file it lies in)."""
        starts = self._extent_starts(record)
        end = offset + length
        first = bisect.bisect_right(starts, offset) - 1
        last = bisect.bisect_left(starts, end)
        pieces = [(record.extents[n], starts[n]) for n in range(max(first, 0), last)]
        chunks = self._get([e for e, _ in pieces if e >= 0], urgent=length < URGENT_BYTES)
        out: list[Piece] = []
        total = 0
        for extent, start in pieces:
            size = -extent if extent < 0 else self.index.chunks[extent].plain_length
            lo, hi = max(offset, start), min(end, start + size)
            if lo < hi:
                if extent < 0:
                    out.append(bytes(hi - lo))
                elif isinstance(chunk := chunks[extent], InPack):
                    out += chunk.ranges(lo - start, hi - start)
                else:
                    out.append(memoryview(chunk)[lo - start:hi - start])
                total += hi - lo
        if total != length:
            raise DigestMismatch(f"{record.name} ends before byte {end} a lazy restore asked for")
        self._read_ahead(record, starts, last)
        return out

    def ready(self, record: FileRecord, offset: int, length: int) -> bool:
        """Whether `read` of this range would answer at once: each of its chunks in a pack
        open on this node or whole and checked by the download, none on its way (a chunk
        only cached could be evicted before the read, and then come by the network)."""
        starts = self._extent_starts(record)
        first = bisect.bisect_right(starts, offset) - 1
        last = bisect.bisect_left(starts, offset + length)
        packs = set()
        with self._lock:
            for n in record.extents[max(first, 0):last]:
                if n >= 0:
                    if n in self._pending:
                        return False
                    packs.add(self.index.chunks[n].pack)
        return all(self._at_hand(p) for p in packs)

    def _at_hand(self, pack: int) -> bool:
        """Whether pack number `pack` is open on this node, or whole and checked."""
        with self._lock:
            if pack in self._fds:
                return True
        return self._arrivals is not None and self._arrivals.checked(self.index.packs[pack].digest)

    def _here(self, pack: int) -> bool:
        """Whether pack number `pack` is read without the network: at hand, or in this node's
        store (opened now; a pack of the wrong size there is refused by its own read)."""
        if self._at_hand(pack):
            return True
        try:
            return self._open_local(pack) is not None
        except DigestMismatch:
            return False

    def chunk_of(self, record: ChunkRecord) -> bytes:
        number = self._numbers[record.digest]
        chunk = self._get([number])[number]
        return chunk.read() if isinstance(chunk, InPack) else chunk

    def _get(self, numbers: list[int], urgent: bool = True) -> dict[int, Chunk]:
        """The chunks `numbers`, fetched (in runs, at once) where not cached or on their way;
        `urgent`: not waiting for the packs' download."""
        found: dict[int, Chunk] = {}
        waiting: list[tuple[int, Future[None]]] = []
        missing: list[int] = []
        with self._lock:
            for n in dict.fromkeys(numbers):
                if n in self._cache:
                    self._cache.move_to_end(n)
                    found[n] = self._cache[n]
                elif n in self._pending:
                    waiting.append((n, self._pending[n]))
                else:
                    missing.append(n)
        futures = self._start(missing, urgent)
        for future in futures:
            future.result()
        for _, pending in waiting:
            pending.result()
        for n in [*missing, *(n for n, _ in waiting)]:
            with self._lock:
                data = self._cache.get(n)
            found[n] = data if data is not None else self._fetch_run([n], urgent)[n]
        return found

    def _start(self, numbers: list[int], urgent: bool = True,
               ahead: bool = False) -> list[Future[None]]:
        """Fetch `numbers` (none cached or pending) in runs on the fetchers; runs that wait for
        the packs' download, or that a pack at hand holds, are read here instead (the first
        never hold a fetcher a page fault needs, the second never wait behind the fetchers'
        range requests), unless they are read `ahead` of CRIU's requests."""
        futures = []
        for run in self._runs(numbers):
            inline = not ahead and ((not urgent and self._arrivals is not None) or
                                    self._at_hand(self.index.chunks[run[0]].pack))
            future: Future[None] = Future() if inline else \
                self._pool.submit(self._fetch_into_cache, run, urgent)
            with self._lock:
                for n in run:
                    self._pending[n] = future
            if inline:
                try:
                    self._fetch_into_cache(run, urgent)
                    future.set_result(None)
                except BaseException as e:
                    future.set_exception(e)
            futures.append(future)
        return futures

    def _read_ahead(self, record: FileRecord, starts: list[int], after: int) -> None:
        if self._arrivals is not None and not self._arrivals.ended:
            return   # the download is the read-ahead while it runs
        wanted, at = [], after
        following = next((n for n in record.extents[after:after + 8] if n >= 0), None)
        window = AHEAD_AT_HAND if following is not None and \
            self._here(self.index.chunks[following].pack) else READ_AHEAD
        limit = (starts[after] if after < len(starts) else 0) + window
        with self._lock:
            while at < len(record.extents) and starts[at] < limit:
                n = record.extents[at]
                if n >= 0 and n not in self._cache and n not in self._pending:
                    wanted.append(n)
                at += 1
        if wanted:
            self._start(wanted, ahead=True)

    def _runs(self, numbers: list[int]) -> list[list[int]]:
        """`numbers` in runs of chunks back to back in one pack, each at most RUN_BYTES."""
        runs: list[list[int]] = []
        for n in sorted(numbers, key=lambda n: (self.index.chunks[n].pack,
                                                self.index.chunks[n].offset)):
            c = self.index.chunks[n]
            if runs:
                last = self.index.chunks[runs[-1][-1]]
                head = self.index.chunks[runs[-1][0]]
                if last.pack == c.pack and last.offset + last.length == c.offset and \
                        c.offset + c.length - head.offset <= RUN_BYTES:
                    runs[-1].append(n)
                    continue
            runs.append([n])
        return runs

    def _fetch_into_cache(self, run: list[int], urgent: bool = True) -> None:
        try:
            got = self._fetch_run(run, urgent)
            with self._lock:
                for n, data in got.items():
                    if n not in self._cache:
                        self._cache[n] = data
                        self._cached += _held(data)
                while self._cached > CACHE_BYTES and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._cached -= _held(old)
        finally:
            with self._lock:
                for n in run:
                    self._pending.pop(n, None)

    def _decoder(self) -> zstandard.ZstdDecompressor:
        if not hasattr(self._zstd, "d"):
            self._zstd.d = zstandard.ZstdDecompressor()
        decoder: zstandard.ZstdDecompressor = self._zstd.d
        return decoder

    def _fetch_run(self, run: list[int], urgent: bool = True) -> dict[int, Chunk]:
        """The chunks of one run (back to back in one pack), each verified; those stored raw
        in a pack the download checked whole, as where they lie in it."""
        records = [self.index.chunks[n] for n in run]
        pack = self.index.packs[records[0].pack]
        start = records[0].offset
        length = records[-1].offset + records[-1].length - start
        fd = self._open_local(records[0].pack)
        span: bytes | bytearray | None
        vouched: Vouched | None = None   # the pack's own index, its digest checked here
        placed: dict[int, Chunk] = {}
        if fd is not None:
            span = os.pread(fd, length, start)
            with self.counts.lock:
                self.counts.local_bytes += len(span)
        elif (arrived := self._arriving(records[0].pack, start, length, urgent)) is not None:
            with self.counts.lock:
                self.counts.streamed_bytes += length
            if isinstance(arrived, CheckedPack):
                placed = {n: c for n, r in zip(run, records, strict=True)
                          if (c := arrived.in_pack(r)) is not None}
                if len(placed) == len(run):
                    return placed
                span, vouched = os.pread(arrived.file.fd, length, start), arrived.vouched
            else:
                span = arrived
        else:
            span = self._remote_span(pack.digest, start, length, records[0])
        view = memoryview(span)
        return placed | {n: decode_chunk(view[r.offset - start:r.offset - start + r.length], r,
                                         pack.digest, self._decoder(), vouched)
                         for n, r in zip(run, records, strict=True) if n not in placed}

    def _arriving(self, number: int, start: int, length: int,
                  urgent: bool) -> CheckedPack | bytes | None:
        """Pack `number` open, once its download has brought it whole and checked its digest
        (`CheckedPack`), or else its bytes `start` to `start + length` from its download so
        far, unchecked: a page fault (`urgent`) takes those if the file holds them already;
        CRIU's background transfer waits (up to the deadline) for the pack to be whole and
        checked, so its chunks are not hashed again. None when the download has not brought
        them, or will not."""
        if self._arrivals is None:
            return None
        digest = self.index.packs[number].digest
        wait_s = 0.0 if urgent else min(WAIT_S, self._give_up_at() - time.monotonic())
        for _ in range(3):   # a file renamed into place (or dropped) while it was looked up
            found = self._arrivals.readable(digest, start + length, wait_s, STALL_S,
                                            whole=not urgent, own_stall_s=PACK_STALL_S)
            if found is None:
                return None
            path, checked = found
            with self._lock:
                if number in self._checked:
                    self._checked.move_to_end(number)
                    return self._checked[number]
            try:
                file = OpenFile(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            except FileNotFoundError:
                continue
            if checked and (kept := self._keep_checked(number, file)) is not None:
                return kept
            data = os.pread(file.fd, length, start)
            # a download begun again reads short
            return data if len(data) == length else None
        return None

    def _keep_checked(self, number: int, file: OpenFile) -> CheckedPack | None:
        """Pack `number`, whole and checked, open as `file`, kept with its own index read
        (the KEPT_PACKS used last); None when the file is not the pack's size."""
        pack = self.index.packs[number]
        if os.fstat(file.fd).st_size != pack.size:
            return None
        kept = CheckedPack(file, vouched_chunks(file.fd, pack.digest))
        with self._lock:
            if self._closed:
                raise ImageError("the lazy restore's page source is closed")
            kept = self._checked.setdefault(number, kept)
            self._checked.move_to_end(number)
            while len(self._checked) > KEPT_PACKS:
                self._checked.popitem(last=False)
        return kept

    def _remote_span(self, digest: str, start: int, length: int,
                     first: ChunkRecord) -> bytes | bytearray:
        if self._remote is None:
            raise DigestMismatch(f"pack {digest} is neither on this node nor in a registry")
        delays = iter(RETRY_S)
        while True:
            try:
                span = self._remote(digest, start, length)
                with self.counts.lock:
                    self.counts.remote_bytes += len(span)
                return span
            except RegistryError as e:
                delay = next(delays, RETRY_S[-1])
                if time.monotonic() + delay > self._give_up_at():
                    raise DeadlineExceeded(
                        f"the registry did not give chunk {first.digest} of pack {digest} "
                        f"before the lazy restore's deadline: {e}") from None
                time.sleep(delay)

    def _open_local(self, number: int) -> int | None:
        with self._lock:
            fd = self._fds.get(number)
            if fd is not None or number in self._not_local:
                return fd
        pack = self.index.packs[number]
        path = self._local(pack.digest, pack.size)   # the store's images, looked through
        if path is None:
            with self._lock:
                self._not_local.add(number)
            return None
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        size = os.fstat(fd).st_size
        if size != pack.size:
            os.close(fd)
            raise DigestMismatch(f"pack {pack.digest} is {size} bytes here, "
                                 f"not the {pack.size} its index says")
        with self._lock:
            if self._closed:
                os.close(fd)
                raise ImageError("the lazy restore's page source is closed")
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


def _held(chunk: Chunk) -> int:
    """What a cached chunk counts for: its bytes (a chunk in a pack keeps its pack open)."""
    return chunk.size if isinstance(chunk, InPack) else len(chunk)
