"""The chunk indexes this node knows to be sound: what a next generation may build on.

A next generation refers to the chunks of the generation it builds on by the places that one's
chunk index gives (pack, offset, length), without reading them (packs.py). Those records are
only as good as whoever wrote the index: an image in the local store that came from elsewhere
(a pull, a restore) may list a chunk where its pack holds other bytes, and a generation built
on it could not be restored, with its container already stopped. So the node keeps a record,
`<[image] store>/verified-indexes/<hex of the index blob's sha256>`, of the chunk indexes whose
every record it knows to be true: written when it writes a generation itself (build.py), and
when it has read every chunk a basis offers back from its pack and found each as the index
says (`verify`, done once per index, the first time a generation would build on it).

A record is about the index's content (named by its digest), not about the image that holds
it: packs are content-addressed and checked on the way into the store, so the same index is
sound over any copy of its packs.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

from torpor.errors import ImageError
from torpor.formats.chunk_index import ChunkIndex
from torpor.image.reassemble import verify_chunks

RECORDS = "verified-indexes"


def _path(store_root: Path, index_digest: str) -> Path | None:
    algorithm, _, hex_part = index_digest.partition(":")
    if algorithm != "sha256" or len(hex_part) != 64 or not hex_part.isalnum():
        return None
    return store_root / RECORDS / hex_part


def recorded(store_root: Path, index_digest: str) -> bool:
    path = _path(store_root, index_digest)
    return path is not None and path.is_file()


def record(store_root: Path, index_digest: str) -> None:
    """Note that the index blob `index_digest` is sound (this node wrote or verified it)."""
    path = _path(store_root, index_digest)
    if path is None:
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    os.close(fd)


def verify(chunks: ChunkIndex, packs: dict[str, Path], wanted: Collection[str]) -> bool:
    """Whether every chunk of `wanted` (digests) is where `chunks` says, in the pack files
    `packs` (digest -> path): each read back, its length and sha256 checked."""
    held = [i for i, p in enumerate(chunks.packs) if p.digest in packs]
    number = {old: new for new, old in enumerate(held)}
    subset = replace(chunks, packs=tuple(chunks.packs[i] for i in held), files=(),
                     chunks=tuple(replace(c, pack=number[c.pack]) for c in chunks.chunks
                                  if c.digest in wanted and c.pack in number))
    if len(subset.chunks) != len(wanted):
        return False
    try:
        verify_chunks(subset, lambda digest: str(packs[digest]))
    except (ImageError, OSError):
        return False
    return True

