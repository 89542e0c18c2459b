"""The checkpoint images this node made itself, by index digest: `[image] store`/made-here/.

`torpor checkpoint` records the digest of every image it builds (-t REF, --push, -o DIR --oci,
and `torpor push` of a checkpoint directory). A registry image whose index has one of these
digests is byte for byte what this node wrote, so `[restore] signatures = "required"` lets it
be restored here unsigned. The directory is the store's (root's, 0700): whoever can write it
can write the node's configuration too.
"""

from __future__ import annotations

import os
from pathlib import Path

from torpor.errors import ImageError
from torpor.formats.digests import split_digest

DIRECTORY = "made-here"


def _entry(store_root: str, digest: str) -> Path:
    algorithm, hex_part = split_digest(digest)
    return Path(store_root) / DIRECTORY / f"{algorithm}-{hex_part}"


def record(store_root: str, digest: str) -> None:
    path = _entry(store_root, digest)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    os.close(fd)


def made_here(store_root: str, digest: str) -> bool:
    try:
        return _entry(store_root, digest).is_file()
    except (OSError, ImageError):
        return False
