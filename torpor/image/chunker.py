"""Cutting a file into page-aligned, content-defined chunks, with all-zero pages set apart.

A file is read as 4 KiB pages. Each page is hashed (CRC-32: ~3 GB/s here, and content is all
a boundary needs; a chunk's identity is the SHA-256 of its bytes, computed by packs.py). A
chunk ends after a page whose hash falls below a threshold, once the chunk holds `min_size`
bytes, or when it reaches `max_size`; the threshold gives chunks of `avg_size` on average. A
boundary depends on one page's content only, so chunks re-synchronise right after an edit:
a changed page changes about one chunk, and pages inserted or moved elsewhere still cut the
same way around them. Runs of all-zero pages are not chunks: they come out as zero spans
(recorded, never stored) and always end the chunk before them. A last partial page is data.

Holes of a sparse file (SEEK_HOLE) are zero spans without being read; the result is the
same as for the dense file with the same bytes.

Stdlib only.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import zlib
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

PAGE = 4096
ZERO_PAGE = bytes(PAGE)
_ZERO_PAGE_CRC = zlib.crc32(ZERO_PAGE)


@dataclass(frozen=True)
class ChunkerParams:
    """Chunk sizes in bytes, multiples of the page size; min <= avg <= max."""

    min_size: int = 32 << 10    # bench/chunks.py: 128 KiB on average stores 1.5x less than
    avg_size: int = 128 << 10   # 256 KiB where 1% of pages change at random places, for an
    max_size: int = 512 << 10   # index of ~850 bytes per MiB (docs/format.md)

    def __post_init__(self) -> None:
        sizes = (self.min_size, self.avg_size, self.max_size)
        if any(s <= 0 or s % PAGE for s in sizes) or not sizes[0] <= sizes[1] <= sizes[2]:
            raise ValueError(f"chunk sizes must be multiples of {PAGE} with min <= avg <= max, "
                             f"not {sizes}")

    @property
    def threshold(self) -> int:
        """A page ends a chunk (past min_size) when its CRC-32 is below this: chance
        PAGE / (avg - min + PAGE) per page, so chunks hold avg_size bytes on average."""
        return (1 << 32) * PAGE // (self.avg_size - self.min_size + PAGE)


DEFAULT_PARAMS = ChunkerParams()


@dataclass(frozen=True)
class Span:
    """`length` bytes of a file from `offset`: a chunk, or (zero=True) a run of zero pages."""

    offset: int
    length: int
    zero: bool = False


def cut(view: memoryview | bytes, params: ChunkerParams = DEFAULT_PARAMS,
        base: int = 0) -> Iterator[Span]:
    """The spans of `view` (which sits at offset `base` of its file), in order."""
    data = memoryview(view)
    try:
        yield from _cut(data, params, base)
    finally:
        data.release()


def _cut(data: memoryview, params: ChunkerParams, base: int) -> Iterator[Span]:
    size = len(data)
    full = size - size % PAGE
    min_pages, max_pages = params.min_size // PAGE, params.max_size // PAGE
    threshold = params.threshold
    crc32 = zlib.crc32
    start = 0       # where the pending chunk (or zero run) begins
    zero_run = False
    pos = 0
    while pos < full:
        page = data[pos:pos + PAGE]
        h = crc32(page)
        is_zero = h == _ZERO_PAGE_CRC and bytes(page) == ZERO_PAGE
        if is_zero != zero_run:  # a zero run begins or ends: the pending span ends here
            if pos > start:
                yield Span(base + start, pos - start, zero_run)
            start, zero_run = pos, is_zero
        pos += PAGE
        if not zero_run:
            pages = (pos - start) // PAGE
            if pages >= max_pages or (pages >= min_pages and h < threshold):
                yield Span(base + start, pos - start)
                start = pos
    if zero_run and pos > start:
        yield Span(base + start, pos - start, True)
        start = pos
    if size > start:  # the pending chunk, with the last partial page if any
        yield Span(base + start, size - start)


def _data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """(start, end) of the regions of the file that may hold data, page-aligned; the whole
    file when the filesystem cannot tell holes."""
    ranges: list[tuple[int, int]] = []
    pos = 0
    try:
        while pos < size:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as e:  # ENXIO: only a hole is left
                if e.errno == 6:
                    break
                raise
            hole = os.lseek(fd, data, os.SEEK_HOLE)
            start, end = data - data % PAGE, min(size, -(-hole // PAGE) * PAGE)
            if ranges and start <= ranges[-1][1]:
                ranges[-1] = (ranges[-1][0], end)
            else:
                ranges.append((start, end))
            pos = hole
    except OSError:
        return [(0, size)] if size else []
    # a partial last page is data even inside a hole, as for the dense file
    tail = size - size % PAGE
    if tail < size and not (ranges and ranges[-1][1] == size):
        if ranges and ranges[-1][1] >= tail:
            ranges[-1] = (ranges[-1][0], size)
        else:
            ranges.append((tail, size))
    return ranges


def _merged(spans: Iterator[Span]) -> Generator[Span, None, None]:
    """Adjacent zero spans as one."""
    pending: Span | None = None
    for span in spans:
        if pending and pending.zero and span.zero:
            pending = Span(pending.offset, pending.length + span.length, True)
            continue
        if pending:
            yield pending
        pending = span
    if pending:
        yield pending


def resumed(mapped: MappedFile, done: Sequence[Span], end: int,
            params: ChunkerParams = DEFAULT_PARAMS) -> Generator[Span, None, None]:
    """The spans of `mapped` given `done`, the spans of its first `end` bytes as `cut` gave
    them on pieces of those bytes (follow.py): every span of a piece but the last chunk, which
    might have gone on, and zero runs split anywhere. Cutting on from the end of a span gives
    what the cut of the whole file gives there: a boundary depends on one page, and after a
    span nothing is pending but whether a zero run goes on, which the next page says again;
    split zero runs are merged. Holes are read as zeros, which cut alike (MappedFile.spans)."""
    def all_spans() -> Iterator[Span]:
        yield from done
        if mapped.size > end:
            view = mapped.view(Span(end, mapped.size - end))
            try:
                yield from cut(view, params, base=end)
            finally:
                view.release()
    return _merged(all_spans())


class MappedFile:
    """A file mapped read-only, for cutting and reading its chunks without copies.

    with MappedFile(path) as f:
        for span in f.spans(params): digest(f.view(span)) ...

    Views handed out must be released (view.release()) before the file is closed.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        self.size = os.fstat(self.fd).st_size
        self._map = mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ) if self.size else None
        self._view = memoryview(self._map) if self._map is not None else memoryview(b"")

    def __enter__(self) -> MappedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._view.release()
        if self._map is not None:
            self._map.close()
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def view(self, span: Span) -> memoryview:
        return self._view[span.offset:span.offset + span.length]

    def spans(self, params: ChunkerParams = DEFAULT_PARAMS) -> Generator[Span, None, None]:
        """The file's spans; holes become zero spans without being read."""
        def all_spans() -> Iterator[Span]:
            pos = 0
            for start, end in _data_ranges(self.fd, self.size):
                if start > pos:
                    yield Span(pos, start - pos, True)
                view = self._view[start:end]
                try:
                    yield from cut(view, params, base=start)
                finally:
                    view.release()
                pos = end
            if self.size > pos:
                yield Span(pos, self.size - pos, True)
        return _merged(all_spans())


class StreamChunker:
    """The chunks of a stream of whole pages, cut exactly as `cut` cuts a file holding the same
    pages, and identified by sha256: for what a checkpoint would store, without a file (torpor
    estimate reads a live process's pages). Feed pages in order with `page()`; each call, and
    `finish()`, returns the chunk it ended as (digest, length, its bytes if `keep_data`), or
    None."""

    def __init__(self, params: ChunkerParams = DEFAULT_PARAMS, keep_data: bool = False) -> None:
        self.data: bytearray | None = bytearray() if keep_data else None
        self._new_hash = hashlib.sha256
        self.min_pages, self.max_pages = params.min_size // PAGE, params.max_size // PAGE
        self.threshold = params.threshold
        self.hasher = self._new_hash()
        self.pages = 0          # in the pending chunk
        self.zero_bytes = 0     # in zero runs so far
        self.total = 0

    def _end(self) -> tuple[str, int, bytes | None] | None:
        if not self.pages:
            return None
        data = None
        if self.data is not None:
            data, self.data = bytes(self.data), bytearray()
        chunk = ("sha256:" + self.hasher.hexdigest(), self.pages * PAGE, data)
        self.hasher = self._new_hash()
        self.pages = 0
        return chunk

    def page(self, page: bytes | memoryview) -> tuple[str, int, bytes | None] | None:
        if len(page) != PAGE:
            raise ValueError(f"StreamChunker takes whole pages of {PAGE} bytes")
        self.total += PAGE
        h = zlib.crc32(page)
        if h == _ZERO_PAGE_CRC and bytes(page) == ZERO_PAGE:
            self.zero_bytes += PAGE
            return self._end()
        self.hasher.update(page)
        if self.data is not None:
            self.data += page
        self.pages += 1
        if self.pages >= self.max_pages or (self.pages >= self.min_pages and h < self.threshold):
            return self._end()
        return None

    def finish(self) -> tuple[str, int, bytes | None] | None:
        return self._end()
