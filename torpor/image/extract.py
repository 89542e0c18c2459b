"""Reading a state layer back: digest-checked as it is decompressed, and never escaping its
target. Only regular files and directories under the allowed top-level names are accepted; a
piece of a big file (PAX header TORPOR.range "<offset> <total>") lands at its offset, so parts
may be extracted in parallel.

Nothing is taken on the layer's word: every path is opened one component at a time below the
target with O_NOFOLLOW (torpor.archive.Target); files are 0600 and directories 0700; a file must
be one the checkpoint's metadata lists, no bigger than it says; and every byte written is
charged to a Budget shared by all the layers of a restore (the metadata's total, within the
configured limit), so a layer that inflates beyond what was declared stops at once, before the
disk fills.
"""

from __future__ import annotations

import os
import tarfile
import threading
from collections.abc import Mapping
from typing import IO, Any, BinaryIO

import zstandard

from torpor.archive import Target, safe_name
from torpor.errors import DigestMismatch, ImageError, UnsafeArchive
from torpor.formats.annotations import RANGE_PAX
from torpor.formats.digests import new_hasher, verify_hasher

CHUNK = 1 << 20


class Budget:
    """Bytes and entries a restore may still write, shared by the threads extracting layers."""

    def __init__(self, max_bytes: int, max_entries: int, what: str = "the checkpoint") -> None:
        self.bytes_left, self.entries_left, self.what = max_bytes, max_entries, what
        self._lock = threading.Lock()

    def charge(self, n: int, entries: int = 0) -> None:
        with self._lock:
            self.bytes_left -= n
            self.entries_left -= entries
            if self.bytes_left < 0:
                raise UnsafeArchive(f"the layers unpack to more bytes than {self.what} declares: "
                                    "stopped (a damaged or hostile image)")
            if self.entries_left < 0:
                raise UnsafeArchive(f"the layers hold more entries than {self.what} allows")


class _VerifyingReader:
    """A file object that hashes what it reads and checks digest and size at the end."""

    def __init__(self, raw: BinaryIO, digest: str, size: int, what: str) -> None:
        self.raw, self.digest, self.size, self.what = raw, digest, size, what
        self.hasher = new_hasher(digest)
        self.seen = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.hasher.update(data)
        self.seen += len(data)
        if self.seen > self.size:
            raise DigestMismatch(f"{self.what} is larger than its descriptor's {self.size} bytes")
        if not data:
            self.check()
        return data

    def check(self) -> None:
        if self.seen != self.size:
            raise ImageError(f"{self.what} is truncated: {self.seen} of {self.size} bytes")
        verify_hasher(self.hasher, self.digest, self.what)


def extract_layer(blob_path: str, digest: str, size: int, target: str,
                  allowed_top: tuple[str, ...], what: str,
                  expected: Mapping[str, int] | None = None,
                  budget: Budget | None = None) -> list[tuple[str, int, int, int]]:
    """Extract a state layer into `target`; returns (name, offset, length, total) per piece.

    Only regular files and directories under `allowed_top` are accepted, and with `expected`
    (path -> size, from the metadata) only the files it lists, at their sizes; everything else
    (links, devices, FIFOs, `..`, absolute names) is refused as UnsafeArchive.
    """
    written: list[tuple[str, int, int, int]] = []
    root = Target(target, create=False)
    try:
        with open(blob_path, "rb") as raw:
            verifying = _VerifyingReader(raw, digest, size, what)
            reader = zstandard.ZstdDecompressor().stream_reader(
                verifying, read_across_frames=True)  # type: ignore[arg-type]
            try:
                with tarfile.open(fileobj=reader, mode="r|") as tar:
                    for member in tar:
                        piece = _extract_member(tar, member, root, allowed_top, what, expected,
                                                budget)
                        if piece is not None:
                            written.append(piece)
                _drain(verifying)  # the rest of the blob (zstd framing): digest it too
            except (tarfile.TarError, zstandard.ZstdError, EOFError) as e:
                _drain(verifying)  # a damaged blob says so by its digest, the clearer reason
                raise ImageError(f"{what} is not a readable tar+zstd layer: {e}") from None
        verifying.check()
    finally:
        root.close()
    return written


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, root: Target,
                    allowed_top: tuple[str, ...], what: str, expected: Mapping[str, int] | None,
                    budget: Budget | None) -> tuple[str, int, int, int] | None:
    name = safe_name(member.name, "layer entry")
    if not name:
        raise UnsafeArchive(f"{what}: an entry has an empty name")
    if name.split("/")[0] not in allowed_top:
        raise UnsafeArchive(f"{what}: entry {name!r} is outside {', '.join(allowed_top)}")
    if budget is not None:
        budget.charge(0, entries=1)
    if member.isdir():
        os.close(root.open_dir(name, create=True))
        return None
    if not member.isfile() or member.issparse():
        raise UnsafeArchive(f"{what}: entry {name!r} is a link, device, FIFO or sparse file")
    offset, total = 0, member.size
    if RANGE_PAX in member.pax_headers:
        try:
            offset, total = (int(v) for v in member.pax_headers[RANGE_PAX].split())
        except ValueError:
            raise UnsafeArchive(f"{what}: entry {name!r} has a bad range") from None
    if offset < 0 or offset + member.size > total:
        raise UnsafeArchive(f"{what}: entry {name!r} has a bad range")
    if expected is not None:
        if name not in expected:
            raise UnsafeArchive(f"{what}: entry {name!r} is not a file the checkpoint's "
                                "metadata lists")
        if total != expected[name]:
            raise UnsafeArchive(f"{what}: entry {name!r} says it is {total} bytes, the "
                                f"checkpoint's metadata {expected[name]}")
    if budget is not None:
        budget.charge(member.size)
    source = tar.extractfile(member)
    assert source is not None
    parent, base = root.parent(name, create=True)
    try:
        _write_range(parent, base, name, source, offset, member.size)
    finally:
        os.close(parent)
    return name, offset, member.size, total


def check_inflation(blob_path: str, media_type: str, declared: int, what: str) -> None:
    """Decompress a layer without writing it, stopping as soon as it inflates beyond `declared`
    bytes (what the checkpoint's metadata says of it): containerd unpacks it without a limit."""
    import gzip

    with open(blob_path, "rb") as raw:
        reader: Any = raw
        if media_type.endswith("zstd"):
            reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        elif media_type.endswith("gzip"):
            reader = gzip.GzipFile(fileobj=raw, mode="rb")
        seen = 0
        try:
            while data := reader.read(CHUNK):
                seen += len(data)
                if seen > declared:
                    raise UnsafeArchive(f"{what} unpacks to more than the {declared} bytes the "
                                        "checkpoint's metadata declares: stopped (a damaged or "
                                        "hostile image)")
        except (zstandard.ZstdError, OSError, EOFError) as e:
            raise ImageError(f"{what} is not a readable layer: {e}") from None


def _drain(verifying: _VerifyingReader) -> None:
    """Read the rest of the blob: raises DigestMismatch or a truncation error if it has one."""
    while verifying.read(CHUNK):
        pass


def _write_range(parent: int, base: str, name: str, source: IO[bytes], offset: int,
                 length: int) -> None:
    fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=parent)
    try:
        position = offset
        left = length
        while left:
            data = source.read(min(CHUNK, left))
            if not data:
                raise ImageError(f"{name}: the layer ended inside this file")
            view = memoryview(data)
            while view:
                n = os.pwrite(fd, view, position)
                view = view[n:]
                position += n
            left -= len(data)
    finally:
        os.close(fd)
