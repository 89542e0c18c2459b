"""Reading a state layer back: digest-checked as it is decompressed, and never escaping its
target. Only regular files and directories under the allowed top-level names are accepted; a
piece of a big file (PAX header TORPOR.range "<offset> <total>") lands at its offset, so parts
may be extracted in parallel."""

from __future__ import annotations

import os
import stat
import tarfile
from typing import IO, BinaryIO

import zstandard

from torpor.archive import safe_name
from torpor.errors import DigestMismatch, ImageError, UnsafeArchive
from torpor.formats.annotations import RANGE_PAX
from torpor.formats.digests import new_hasher, verify_hasher

CHUNK = 1 << 20


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
                  allowed_top: tuple[str, ...], what: str) -> list[tuple[str, int, int, int]]:
    """Extract a state layer into `target`; returns (name, offset, length, total) per piece.

    Only regular files and directories under `allowed_top` are accepted; everything else
    (links, devices, FIFOs, `..`, absolute names) is refused as UnsafeArchive.
    """
    root = os.path.realpath(target)
    written: list[tuple[str, int, int, int]] = []
    with open(blob_path, "rb") as raw:
        verifying = _VerifyingReader(raw, digest, size, what)
        reader = zstandard.ZstdDecompressor().stream_reader(
            verifying, read_across_frames=True)  # type: ignore[arg-type]
        try:
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                for member in tar:
                    name = safe_name(member.name, "layer entry")
                    if not name:
                        raise UnsafeArchive(f"{what}: an entry has an empty name")
                    if name.split("/")[0] not in allowed_top:
                        raise UnsafeArchive(f"{what}: entry {name!r} is outside "
                                            f"{', '.join(allowed_top)}")
                    path = os.path.join(root, name)
                    if member.isdir():
                        _make_dirs(root, name)
                        continue
                    if not member.isfile():
                        raise UnsafeArchive(f"{what}: entry {name!r} is a link, device or FIFO")
                    offset, total = 0, member.size
                    if RANGE_PAX in member.pax_headers:
                        try:
                            offset, total = (int(v) for v in member.pax_headers[RANGE_PAX].split())
                        except ValueError:
                            raise UnsafeArchive(f"{what}: entry {name!r} has a bad range") from None
                        if offset < 0 or offset + member.size > total:
                            raise UnsafeArchive(f"{what}: entry {name!r} has a bad range")
                    _make_dirs(root, os.path.dirname(name))
                    source = tar.extractfile(member)
                    assert source is not None
                    _write_range(path, source, offset, member.size)
                    written.append((name, offset, member.size, total))
            _drain(verifying)  # the rest of the blob (zstd framing): digest it too
        except (tarfile.TarError, zstandard.ZstdError, EOFError) as e:
            _drain(verifying)  # a damaged blob says so by its digest, the clearer reason
            raise ImageError(f"{what} is not a readable tar+zstd layer: {e}") from None
    verifying.check()
    return written


def _drain(verifying: _VerifyingReader) -> None:
    """Read the rest of the blob: raises DigestMismatch or a truncation error if it has one."""
    while verifying.read(CHUNK):
        pass


def _make_dirs(root: str, rel: str) -> None:
    current = root
    for part in [p for p in rel.split("/") if p]:
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o700)
            continue
        except FileExistsError:  # made by another part's thread, or in the layer already
            st = os.lstat(current)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeArchive(f"{current} is in the way of a directory")


def _write_range(path: str, source: IO[bytes], offset: int, length: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        position = offset
        left = length
        while left:
            data = source.read(min(CHUNK, left))
            if not data:
                raise ImageError(f"{path}: the layer ended inside this file")
            view = memoryview(data)
            while view:
                n = os.pwrite(fd, view, position)
                view = view[n:]
                position += n
            left -= len(data)
    finally:
        os.close(fd)
