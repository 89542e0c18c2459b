"""Content digests (`algorithm:hex`): validated before they name a file or a URL, checked on every read.

A digest that fails validation never reaches a path: `blobs/<algorithm>/<hex>` is built only
from the algorithms below and lowercase hex of their exact length.
"""

from __future__ import annotations

import hashlib
import re
from typing import Protocol

from torpor.errors import DigestMismatch, ImageError

HEX_LENGTH = {"sha256": 64, "sha512": 128}
_HEX = re.compile(r"[0-9a-f]+")


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...
    def hexdigest(self) -> str: ...
    def copy(self) -> Hasher: ...


def split_digest(digest: str) -> tuple[str, str]:
    """(algorithm, hex) of a digest torpor can verify; ImageError for anything else."""
    algorithm, _, hex_part = digest.partition(":")
    length = HEX_LENGTH.get(algorithm)
    if length is None:
        raise ImageError(f"unsupported digest {digest!r}: torpor verifies sha256 and sha512 digests")
    if len(hex_part) != length or not _HEX.fullmatch(hex_part):
        raise ImageError(f"malformed digest {digest!r}: expected {algorithm}: and {length} hex digits")
    return algorithm, hex_part


def new_hasher(digest: str) -> Hasher:
    """A hasher of the algorithm that `digest` names."""
    algorithm, _ = split_digest(digest)
    return hashlib.new(algorithm)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def verify_bytes(data: bytes, digest: str, what: str) -> None:
    """DigestMismatch unless `data` hashes to `digest`."""
    hasher = new_hasher(digest)
    hasher.update(data)
    verify_hasher(hasher, digest, what)


def verify_hasher(hasher: Hasher, digest: str, what: str) -> None:
    algorithm, expected = split_digest(digest)
    actual = hasher.hexdigest()
    if actual != expected:
        raise DigestMismatch(f"{what} does not match its digest {digest}: the content hashes "
                             f"to {algorithm}:{actual}",
                             hint="the source holds corrupted or tampered content; nothing was kept")


def sha256_file(path: str) -> str:
    """The sha256 digest of a file, read in 1 MiB pieces."""
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            hasher.update(chunk)
    return "sha256:" + hasher.hexdigest()
