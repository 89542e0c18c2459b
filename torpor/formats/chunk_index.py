"""The chunk index of a generation and the index inside each pack (docs/format.md).

A generation's files (CRIU's pages-*.img, or any file) are lists of extents: a chunk of the
index's chunk table, or a run of zero bytes. The chunk table says where each chunk lives: a
pack blob (by number in the pack table), an offset and a length there, and the chunk's length
before compression. Both indexes are deterministic JSON (sorted keys, no spaces, rows as
arrays), so the same content always has the same digest.

`from_json` trusts nothing: it rejects unknown versions and fields, malformed digests and
names, references out of range and extents that do not add up to a file's size. Size limits
that depend on the node (disk, memory) are checked by the reader (image/reassemble.py).

Stdlib only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from torpor.errors import ImageError, UnsafeArchive
from torpor.formats.mediatypes import CHUNK_INDEX, PACK, PACK_INDEX

__all__ = ["CHUNK_INDEX", "PACK", "PACK_INDEX", "ChunkIndex", "ChunkRecord", "Chunking",
           "FileRecord", "PackIndex", "PackRecord", "safe_name"]
VERSION = 2              # of the chunk index: 1 also listed each file's sha256 (read, unused)
PACK_INDEX_VERSION = 1
CHUNKER = "page-crc32-v1"   # chunker.py's boundaries: a page's CRC-32 below a threshold
COMPRESSION = "zstd"        # each chunk one zstd frame, content size written, no checksum
MAX_INDEX_BYTES = 256 << 20

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")


@dataclass(frozen=True)
class Chunking:
    """How the chunks were cut and compressed; a next generation cuts the same way."""

    min_size: int
    avg_size: int
    max_size: int
    level: int
    page_size: int = 4096
    algorithm: str = CHUNKER
    compression: str = COMPRESSION


@dataclass(frozen=True)
class PackRecord:
    digest: str   # sha256 of the pack blob
    size: int     # bytes of the pack blob


@dataclass(frozen=True)
class ChunkRecord:
    digest: str        # sha256 of the chunk's bytes (before compression)
    pack: int          # number in the index's pack table
    offset: int        # of the chunk's zstd frame in the pack
    length: int        # of the zstd frame
    plain_length: int  # of the chunk's bytes


@dataclass(frozen=True)
class FileRecord:
    """A file: `extents` n >= 0 is chunk n of the chunk table, n < 0 is -n zero bytes."""

    name: str     # relative, '/'-separated, no '.', '..' or empty parts
    size: int
    extents: tuple[int, ...]


@dataclass(frozen=True)
class ChunkIndex:
    chunking: Chunking
    packs: tuple[PackRecord, ...]
    chunks: tuple[ChunkRecord, ...]
    files: tuple[FileRecord, ...]

    def to_json(self) -> bytes:
        return _dumps({
            "mediaType": CHUNK_INDEX,
            "version": VERSION,
            "chunking": {"algorithm": self.chunking.algorithm, "page_size": self.chunking.page_size,
                         "min_size": self.chunking.min_size, "avg_size": self.chunking.avg_size,
                         "max_size": self.chunking.max_size,
                         "compression": self.chunking.compression, "level": self.chunking.level},
            "packs": [[p.digest, p.size] for p in self.packs],
            "chunks": [[c.digest, c.pack, c.offset, c.length, c.plain_length] for c in self.chunks],
            "files": [{"name": f.name, "size": f.size, "extents": list(f.extents)}
                      for f in self.files],
        })

    @classmethod
    def from_json(cls, data: bytes, max_bytes: int = MAX_INDEX_BYTES) -> ChunkIndex:
        top = _loads(data, max_bytes, "chunk index")
        version = _check_header(top, CHUNK_INDEX, {"chunking", "packs", "chunks", "files"},
                                "chunk index", (1, VERSION))
        ck = _obj(top["chunking"], "chunking")
        _keys(ck, {"algorithm", "page_size", "min_size", "avg_size", "max_size", "compression",
                   "level"}, "chunking")
        if ck["algorithm"] != CHUNKER or ck["compression"] != COMPRESSION or ck["page_size"] != 4096:
            raise ImageError(f"chunk index: chunking {ck['algorithm']!r}/{ck['compression']!r}/"
                             f"{ck['page_size']!r} is not known to this torpor")
        chunking = Chunking(_uint(ck["min_size"], "min_size"), _uint(ck["avg_size"], "avg_size"),
                            _uint(ck["max_size"], "max_size"), _int(ck["level"], "level"))
        sizes = (chunking.min_size, chunking.avg_size, chunking.max_size)
        if any(s == 0 or s % 4096 for s in sizes) or sorted(sizes) != list(sizes):
            raise ImageError(f"chunk index: chunk sizes {sizes} are not valid")
        packs = tuple(PackRecord(_digest(row[0]), _uint(row[1], "pack size"))
                      for row in (_row(r, 2, "pack") for r in _list(top["packs"], "packs")))
        if len({p.digest for p in packs}) != len(packs):
            raise ImageError("chunk index: a pack is listed twice")
        chunks = []
        for r in _list(top["chunks"], "chunks"):
            row = _row(r, 5, "chunk")
            chunk = ChunkRecord(_digest(row[0]), *(_uint(v, "chunk field") for v in row[1:]))
            if chunk.pack >= len(packs) or chunk.length == 0 or chunk.plain_length == 0 \
                    or chunk.offset + chunk.length > packs[chunk.pack].size:
                raise ImageError(f"chunk index: chunk {chunk.digest} lies outside its pack")
            chunks.append(chunk)
        if len({c.digest for c in chunks}) != len(chunks):
            raise ImageError("chunk index: a chunk is listed twice")
        files = tuple(_file(f, chunks, version) for f in _list(top["files"], "files"))
        if len({f.name for f in files}) != len(files):
            raise ImageError("chunk index: a file is listed twice")
        return cls(chunking, packs, tuple(chunks), files)


@dataclass(frozen=True)
class PackIndex:
    """The index at the end of a pack: (digest, offset, length, plain length) per chunk."""

    chunks: tuple[tuple[str, int, int, int], ...]

    def to_json(self) -> bytes:
        return _dumps({"mediaType": PACK_INDEX, "version": PACK_INDEX_VERSION,
                       "chunks": [list(c) for c in self.chunks]})

    @classmethod
    def from_json(cls, data: bytes, pack_size: int) -> PackIndex:
        top = _loads(data, MAX_INDEX_BYTES, "pack index")
        _check_header(top, PACK_INDEX, {"chunks"}, "pack index", (PACK_INDEX_VERSION,))
        chunks = []
        for r in _list(top["chunks"], "chunks"):
            row = _row(r, 4, "chunk")
            digest, offset, length, plain = (_digest(row[0]), _uint(row[1], "offset"),
                                             _uint(row[2], "length"), _uint(row[3], "plain length"))
            if offset + length > pack_size or not length or not plain:
                raise ImageError(f"pack index: chunk {digest} lies outside its pack")
            chunks.append((digest, offset, length, plain))
        return cls(tuple(chunks))


def safe_name(name: object) -> str:
    """A file name of an index, refused unless it is a plain relative path."""
    if not isinstance(name, str) or not name or len(name) > 4096 or "\0" in name:
        raise UnsafeArchive(f"chunk index: file name {name!r} is not a plain relative path")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafeArchive(f"chunk index: file name {name!r} is not a plain relative path")
    return name


def _file(value: object, chunks: list[ChunkRecord], version: int) -> FileRecord:
    f = _obj(value, "file")
    if version == 1:   # each file's sha256 too: checked for form, never used (the chunks' are)
        _keys(f, {"name", "size", "digest", "extents"}, "file")
        _digest(f["digest"])
    else:
        _keys(f, {"name", "size", "extents"}, "file")
    name, size = safe_name(f["name"]), _uint(f["size"], "file size")
    extents = tuple(_int(e, "extent") for e in _list(f["extents"], "extents"))
    total = 0
    for e in extents:
        if e >= len(chunks):
            raise ImageError(f"chunk index: {name} refers to chunk {e}, which is not listed")
        total += chunks[e].plain_length if e >= 0 else -e
    if total != size:
        raise ImageError(f"chunk index: the extents of {name} add up to {total} bytes, "
                         f"not its size {size}")
    return FileRecord(name, size, extents)


def _dumps(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ImageError("an index has a key twice")
    return out


def _loads(data: bytes, max_bytes: int, what: str) -> dict[str, Any]:
    if len(data) > max_bytes:
        raise ImageError(f"{what} is {len(data)} bytes, over the limit of {max_bytes}")
    try:
        value = json.loads(data, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:
        raise ImageError(f"{what} is not valid JSON: {e}") from None
    return _obj(value, what)


def _check_header(top: dict[str, Any], media_type: str, fields: set[str], what: str,
                  versions: tuple[int, ...]) -> int:
    """The document's version, one of `versions`; its media type and fields checked."""
    version = top.get("version")
    if type(version) is not int or version not in versions:
        known = " and ".join(str(v) for v in versions)
        raise ImageError(f"{what} version {version!r} is not known to this torpor "
                         f"(it reads version {known}; a newer torpor may read it)")
    if top.get("mediaType") != media_type:
        raise ImageError(f"{what} has media type {top.get('mediaType')!r}, not {media_type}")
    _keys(top, fields | {"mediaType", "version"}, what)
    return version


def _keys(obj: dict[str, Any], expected: set[str], what: str) -> None:
    if set(obj) != expected:
        odd = sorted(set(obj) ^ expected)
        raise ImageError(f"{what}: unexpected or missing fields {', '.join(odd)}")


def _obj(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ImageError(f"{what} is not a JSON object")
    return value


def _list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ImageError(f"{what} is not a JSON array")
    return value


def _row(value: object, n: int, what: str) -> list[Any]:
    row = _list(value, what)
    if len(row) != n:
        raise ImageError(f"a {what} row has {len(row)} fields, not {n}")
    return row


def _int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ImageError(f"{what} {value!r} is not an integer")
    return value


def _uint(value: object, what: str) -> int:
    number = _int(value, what)
    if number < 0:
        raise ImageError(f"{what} {value!r} is negative")
    return number


def _digest(value: object) -> str:
    if not isinstance(value, str) or not _DIGEST.match(value):
        raise ImageError(f"{value!r} is not a sha256 digest")
    return value
