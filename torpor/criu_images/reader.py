"""CRIU's image files, read with CRIU's own definitions (pycriu, built from the CRIU source
tarball by packaging/install-deps.sh: its images/*.proto compiled, nothing of it in torpor's
tree).

An image file is a magic number, or two (IMG_COMMON or IMG_SERVICE, then the image's own), then
records: a u32 little-endian size and a protobuf message of that size. The images read here
(inventory, pstree, core, ids, files, mountpoints, remap-fpath, tty-info) carry no payload after
their records, unlike pagemap or ghost files, which are never read. Every read is bounded: an
image larger than MAX_IMAGE_BYTES, a record that runs past the end, a magic that is not the one
the file's name promises, or a message protobuf cannot parse is a FormatError naming the file.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from torpor.errors import FormatError, RestoreError

CRIU_VERSION = "4.2.1"
MAX_IMAGE_BYTES = 64 << 20   # a core or files image of a genuine dump is a few KB to a few MB

_loaded: tuple[ModuleType, ModuleType] | None = None


def definitions() -> tuple[ModuleType, ModuleType]:
    """pycriu's message classes (`pb`) and magic numbers (`magic`); RestoreError when they are
    not installed on this node."""
    global _loaded
    if _loaded is None:
        try:
            from pycriu.images import magic, pb
        except Exception as e:  # absent, or built for another protobuf
            raise RestoreError(
                "CRIU's image definitions (pycriu) are not installed for this Python: torpor "
                "cannot check the checkpoint's CRIU images, and restores nothing unchecked "
                f"({type(e).__name__}: {e})",
                hint=f"run packaging/install-deps.sh (make deps), which builds pycriu "
                f"{CRIU_VERSION} from CRIU's source tarball into torpor's environment") from None
        _loaded = (pb, magic)
    return _loaded


def read_entries(path: str, magic_name: str, message: str) -> list[Any]:
    """Every record of the image at `path`, as `message` (a class name of pycriu.images.pb)."""
    return list(_records(path, magic_name, message))


def read_one(path: str, magic_name: str, message: str) -> Any:
    entries = read_entries(path, magic_name, message)
    if len(entries) != 1:
        raise FormatError(f"the CRIU image {os.path.basename(path)} holds {len(entries)} "
                          "entries, not one")
    return entries[0]


def read_headed(path: str, magic_name: str, head: str, message: str) -> tuple[Any, list[Any]]:
    """An image whose first record is a `head` and the rest `message`s (pagemap-*.img)."""
    records = _records(path, magic_name, message, head)
    first = next(records, None)
    if first is None:
        raise FormatError(f"the CRIU image {os.path.basename(path)} has no {head} record")
    return first, list(records)


def _records(path: str, magic_name: str, message: str, head: str | None = None) -> Iterator[Any]:
    pb, magic = definitions()
    name = os.path.basename(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise FormatError(f"the CRIU image {name} cannot be read: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FormatError(f"the CRIU image {name} is not a regular file")
        data = f.read(MAX_IMAGE_BYTES + 1)
    if len(data) > MAX_IMAGE_BYTES:
        raise FormatError(f"the CRIU image {name} is larger than {MAX_IMAGE_BYTES >> 20} MiB")
    offset = _check_magic(data, magic.by_name, magic_name, name)
    cls = getattr(pb, head or message)
    while offset < len(data):
        if offset + 4 > len(data):
            raise FormatError(f"the CRIU image {name} ends inside a record's size")
        (size,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + size > len(data):
            raise FormatError(f"the CRIU image {name} has a record of {size} bytes past its end")
        entry = cls()
        try:
            entry.ParseFromString(data[offset:offset + size])
        except Exception as e:  # google.protobuf.message.DecodeError, and missing required fields
            raise FormatError(f"the CRIU image {name} has a record protobuf cannot parse as "
                              f"{message}: {e}") from None
        offset += size
        yield entry
        cls = getattr(pb, message)


def _check_magic(data: bytes, by_name: dict[str, int], magic_name: str, name: str) -> int:
    if len(data) < 4:
        raise FormatError(f"the CRIU image {name} is too short for its magic number")
    (first,) = struct.unpack_from("<I", data, 0)
    offset = 4
    if first in (by_name["IMG_COMMON"] & 0xFFFFFFFF, by_name["IMG_SERVICE"] & 0xFFFFFFFF):
        if len(data) < 8:
            raise FormatError(f"the CRIU image {name} is too short for its magic number")
        (first,) = struct.unpack_from("<I", data, 4)
        offset = 8
    if first != by_name[magic_name] & 0xFFFFFFFF:
        raise FormatError(f"the CRIU image {name} is not a {magic_name} image "
                          f"(magic {first:#x})")
    return offset
