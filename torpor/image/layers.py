"""Writing layers as tar+zstd, in parallel (extract.py reads them back).

A layer is a list of pieces (a file, or a byte range of a big file, marked with the PAX header
TORPOR.range "<offset> <total>") streamed from disk through one pass that writes tar headers,
compresses with zstd and computes the compressed digest and size (and, for image layers, the
uncompressed diff ID); several layers compress at once, on threads, since zstd and sha256
release the GIL. A checkpoint never sits in Python's memory.

Layers are deterministic: the same files give the same bytes, hence the same digest, on any
node, whenever written: entries in the order given (build.py sorts them), headers with fixed
metadata (mode 0600, owner 0:0, mtime 0: extraction writes every file 0600 anyway), one zstd
frame per layer at a fixed level, single-threaded, no checksum.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import BinaryIO

import zstandard

from torpor.errors import ImageError
from torpor.formats.annotations import RANGE_PAX

BLOCK = 512
CHUNK = 1 << 20
Progress = Callable[[int], None]


@dataclass(frozen=True)
class Piece:
    """`length` bytes of `path` from `offset`, stored as `name` (relative, '/'-separated)."""

    path: str
    name: str
    offset: int
    length: int
    total: int  # the whole file's size; a piece is a range when length != total

    @property
    def is_range(self) -> bool:
        return self.length != self.total


@dataclass
class WrittenLayer:
    path: str
    digest: str      # sha256 of the compressed blob
    size: int        # compressed size
    diff_id: str     # sha256 of the uncompressed tar (image layers only; else "")
    raw_size: int    # uncompressed tar size
    pieces: list[Piece] = field(default_factory=list)


def pieces_of(root: str, rels: Iterable[str], chunk: int) -> list[Piece]:
    """Files under `root` as pieces of at most `chunk` bytes."""
    out = []
    for rel in rels:
        path = os.path.join(root, rel)
        size = os.path.getsize(path)
        if size <= chunk:
            out.append(Piece(path, rel, 0, size, size))
            continue
        for offset in range(0, size, chunk):
            out.append(Piece(path, rel, offset, min(chunk, size - offset), size))
    return out


def group(pieces: list[Piece], target: int) -> list[list[Piece]]:
    """Consecutive pieces in groups of about `target` bytes (one layer each)."""
    groups: list[list[Piece]] = [[]]
    size = 0
    for piece in pieces:
        if groups[-1] and size + piece.length > target:
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += piece.length
    return [g for g in groups if g]


class _Sink:
    """Compresses into a file while hashing both sides."""

    def __init__(self, out: BinaryIO, level: int, diff_id: bool = False) -> None:
        self.out = out
        self.compressed = hashlib.sha256()
        self.raw = hashlib.sha256() if diff_id else None  # only image layers need a diff ID
        self.raw_size = 0
        self.size = 0
        self.compressor = zstandard.ZstdCompressor(
            level=level, write_checksum=False, write_content_size=False, write_dict_id=False,
            threads=0).compressobj()

    def _emit(self, data: bytes) -> None:
        if data:
            self.out.write(data)
            self.compressed.update(data)
            self.size += len(data)

    def write(self, data: bytes | memoryview) -> None:
        if self.raw is not None:
            self.raw.update(data)
        self.raw_size += len(data)
        self._emit(self.compressor.compress(data))

    def close(self) -> None:
        self._emit(self.compressor.flush())


def _header(piece: Piece) -> bytes:
    """A tar header that depends on the name and the bytes only (no time, owner or mode)."""
    info = tarfile.TarInfo(piece.name)
    info.size = piece.length
    info.mode = 0o600
    info.mtime = 0
    if piece.is_range:
        info.pax_headers = {RANGE_PAX: f"{piece.offset} {piece.total}"}
    return info.tobuf(format=tarfile.PAX_FORMAT)


def write_layer(pieces: list[Piece], out_path: str, level: int = 1,
                progress: Progress | None = None) -> WrittenLayer:
    """One tar+zstd layer of `pieces`, written to `out_path` (0600)."""
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb", buffering=CHUNK) as out:
        sink = _Sink(out, level)
        for piece in pieces:
            with open(piece.path, "rb", buffering=0) as src:
                st = os.fstat(src.fileno())
                if st.st_size != piece.total:
                    raise ImageError(f"{piece.path} changed size while it was being packed")
                sink.write(_header(piece))
                src.seek(piece.offset)
                left = piece.length
                while left:
                    data = src.read(min(CHUNK, left))
                    if not data:
                        raise ImageError(f"{piece.path} ended early while it was being packed")
                    sink.write(data)
                    left -= len(data)
                    if progress:
                        progress(len(data))
                padding = -piece.length % BLOCK
                if padding:
                    sink.write(b"\0" * padding)
        sink.write(b"\0" * (BLOCK * 2))
        sink.close()
    return WrittenLayer(out_path, "sha256:" + sink.compressed.hexdigest(), sink.size, "",
                        sink.raw_size, pieces)


def write_layers(groups: list[list[Piece]], out_dir: str, level: int = 1, workers: int = 0,
                 progress: Progress | None = None,
                 on_done: Callable[[WrittenLayer], None] | None = None) -> list[WrittenLayer]:
    """Each group as a layer under `out_dir`, compressed in parallel; in the groups' order.
    `on_done(layer)` is called (from a worker thread) as each layer is finished."""
    workers = workers or max(1, min(len(groups), os.cpu_count() or 1))
    lock = threading.Lock()

    def report(n: int) -> None:
        if progress:
            with lock:
                progress(n)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="torpor-zstd") as pool:
        def one(i: int, group: list[Piece]) -> WrittenLayer:
            layer = write_layer(group, os.path.join(out_dir, f"layer-{i}.tar.zst"), level, report)
            if on_done is not None:
                on_done(layer)
            return layer

        futures = [pool.submit(one, i, g) for i, g in enumerate(groups)]
        return [f.result() for f in futures]


def compress_file(path: str, out_path: str, level: int = 1,
                  progress: Progress | None = None) -> WrittenLayer:
    """A file that already is a tar (the read-write layer), as a tar+zstd blob."""
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb", buffering=CHUNK) as out, open(path, "rb", buffering=0) as src:
        sink = _Sink(out, level, diff_id=True)
        while data := src.read(CHUNK):
            sink.write(data)
            if progress:
                progress(len(data))
        sink.close()
    assert sink.raw is not None
    return WrittenLayer(out_path, "sha256:" + sink.compressed.hexdigest(), sink.size,
                        "sha256:" + sink.raw.hexdigest(), sink.raw_size)
