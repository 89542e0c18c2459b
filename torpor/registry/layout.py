"""OCI image-layout directories: `oci-layout`, `index.json`, `blobs/<algorithm>/<hex>`.

Reads are digest-checked (small documents in memory, large blobs while they stream). Writes go
to a temporary file in the blob's own directory, renamed into place once complete; files are
0600 and directories 0700, since a checkpoint holds a workload's memory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torpor.atomicfile import write_atomic
from torpor.errors import ImageError
from torpor.formats import mediatypes
from torpor.formats.digests import new_hasher, split_digest, verify_bytes
from torpor.formats.oci import Descriptor, OciDocument
from torpor.registry import manifests

REF_NAME = "org.opencontainers.image.ref.name"
FILE_MODE = 0o600
DIR_MODE = 0o700


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def blob_path(self, digest: str) -> Path:
        algorithm, hex_part = split_digest(digest)
        return self.root / "blobs" / algorithm / hex_part

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def holds_intact(self, blob: Descriptor) -> bool:
        """Whether the blob is here with its size and digest (it is hashed, not trusted)."""
        path = self.blob_path(blob.digest)
        try:
            with open(path, "rb", buffering=0) as f:
                if os.fstat(f.fileno()).st_size != blob.size:
                    return False
                hasher = new_hasher(blob.digest)
                buffer = memoryview(bytearray(1 << 20))
                while n := f.readinto(buffer):
                    hasher.update(buffer[:n])
        except FileNotFoundError:
            return False
        return hasher.hexdigest() == split_digest(blob.digest)[1]

    def read_small(self, descriptor: Descriptor, limit: int, what: str) -> bytes:
        """A digest-checked blob of at most `limit` bytes (a manifest or a config)."""
        if descriptor.size > limit:
            raise ImageError(f"{what} {descriptor.digest} is {descriptor.size} bytes, more than the "
                             f"limit of {limit}")
        path = self.blob_path(descriptor.digest)
        try:
            with open(path, "rb") as f:
                data = f.read(descriptor.size + 1)  # (read(limit) would allocate the limit)
        except FileNotFoundError:
            raise ImageError(f"{what} {descriptor.digest} is missing from the layout {self.root}") from None
        if len(data) != descriptor.size:
            raise ImageError(f"{what} {descriptor.digest} in {self.root} is {len(data)} bytes, "
                             f"its descriptor says {descriptor.size}")
        verify_bytes(data, descriptor.digest, f"{what} {descriptor.digest} in {self.root}")
        return data

    def read_index(self) -> OciDocument:
        path = self.root / "index.json"
        try:
            body = path.read_bytes()
        except FileNotFoundError:
            raise ImageError(f"{self.root} is not an OCI image layout: it has no index.json") from None
        return manifests.parse_manifest(body, f"{path}")

    def index_entries(self) -> list[Descriptor]:
        entries = self.read_index().get("manifests", [])
        if not isinstance(entries, list):
            raise ImageError(f"{self.root}/index.json: 'manifests' is not a list")
        return [Descriptor.from_json(e, f"{self.root}/index.json manifests[{i}]")
                for i, e in enumerate(entries)]

    def create(self) -> bool:
        """Make the layout's directories; True if the root did not exist before."""
        created = not self.root.exists()
        self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        (self.root / "blobs").mkdir(mode=DIR_MODE, exist_ok=True)
        return created

    def blob_dir(self, digest: str) -> Path:
        directory = self.blob_path(digest).parent
        directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        return directory

    def write_small(self, digest: str, data: bytes, durable: bool) -> Path:
        """Write a digest-checked document as a blob; returns its path."""
        verify_bytes(data, digest, f"blob {digest}")
        path = self.blob_path(digest)
        self.blob_dir(digest)
        write_atomically(path, data, durable)
        return path

    def tag(self, descriptor: Descriptor, name: str | None) -> None:
        """Name `descriptor` in index.json (replacing an entry of the same name) and write oci-layout."""
        index: dict[str, Any] = {"schemaVersion": 2, "mediaType": mediatypes.OCI_INDEX, "manifests": []}
        if (self.root / "index.json").exists():
            index = self.read_index()
        entry = descriptor.to_json()
        if name:
            entry["annotations"] = {**descriptor.annotations, REF_NAME: name}
        kept = [e for e in index.get("manifests", []) if not _same_entry(e, descriptor.digest, name)]
        index["manifests"] = [*kept, entry]
        write_atomically(self.root / "oci-layout", mediatypes.OCI_LAYOUT_VERSION.encode())
        write_atomically(self.root / "index.json", json.dumps(index, indent=2).encode())


def _same_entry(entry: object, digest: str, name: str | None) -> bool:
    """Whether an index.json entry is the one a new entry replaces: same name, or unnamed and same digest."""
    if not isinstance(entry, dict):
        return False
    annotations = entry.get("annotations")
    entry_name = annotations.get(REF_NAME) if isinstance(annotations, dict) else None
    if name:
        return bool(entry_name == name)
    return entry_name is None and entry.get("digest") == digest


def write_atomically(path: Path, data: bytes, durable: bool = True) -> None:
    """Write `data` to a temporary file beside `path` (0600), fsync it if `durable`, rename it."""
    write_atomic(str(path), data, mode=FILE_MODE, durable=durable)
