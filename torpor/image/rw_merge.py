"""One read-write layer out of two: what a container restored from a checkpoint image has
changed, on top of the read-write layer that image already carried.

A container restored from a checkpoint image runs on that image's layers: its base image's, then
the read-write layer of the checkpoint. Checkpointed again, its own read-write layer holds only
what changed since the restore. Stacked as one more layer, every generation would add one: the
image grows without bound (overlayfs mounts at most 500 lower layers, and containerd's mount
options one page). So the new generation's image is the base image's layers plus one layer:
this merge of the older read-write layer and the newer.

OCI layer semantics, applied older then newer, are kept: every entry of the newer layer stays;
an entry of the older one goes when the newer one has the same path, whites it out, makes one of
its ancestors opaque or replaces an ancestor by a file. A whiteout in the older layer of a path
the newer one creates as a directory becomes that directory's opaque marker, so what the base
image had there stays hidden. A hard link of the older layer whose target went is written as a
copy of the target's content. Entries are written in the order of their layers, the older's
first: a directory's opaque marker always comes before the entries it lets through.
"""

from __future__ import annotations

import tarfile
from typing import BinaryIO

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def _norm(name: str) -> str:
    name = name.lstrip("/")
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def _split(path: str) -> tuple[str, str]:
    parent, _, leaf = path.rpartition("/")
    return parent, leaf


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class _Newer:
    """What the newer layer does to paths below it."""

    def __init__(self, members: list[tarfile.TarInfo]) -> None:
        self.paths: set[str] = set()
        self.dirs: set[str] = set()
        self.files: set[str] = set()       # non-directories: nothing of the older below them
        self.whiteouts: set[str] = set()   # paths removed
        self.opaque: set[str] = set()      # directories whose older content is hidden
        for member in members:
            path = _norm(member.name)
            parent, leaf = _split(path)
            if leaf == OPAQUE:
                self.opaque.add(parent)
            elif leaf.startswith(WHITEOUT):
                self.whiteouts.add(f"{parent}/{leaf[len(WHITEOUT):]}".lstrip("/"))
            else:
                self.paths.add(path)
                (self.dirs if member.isdir() else self.files).add(path)

    def hides(self, path: str) -> bool:
        """Whether nothing of the older layer at `path` survives the newer one."""
        if path in self.whiteouts:
            return True
        return any(a in self.whiteouts or a in self.files or a in self.opaque
                   for a in _ancestors(path))


def merge(older: BinaryIO, newer: BinaryIO, out: BinaryIO) -> None:
    """Write to `out` one uncompressed tar layer equal to `older` then `newer` (seekable tars)."""
    with tarfile.open(fileobj=older, mode="r:") as old_tar, \
            tarfile.open(fileobj=newer, mode="r:") as new_tar, \
            tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as merged:
        new_members = new_tar.getmembers()
        after = _Newer(new_members)
        old_members = old_tar.getmembers()
        dropped: set[str] = set()
        make_opaque: set[str] = set()
        kept: list[tarfile.TarInfo] = []
        for member in old_members:
            path = _norm(member.name)
            parent, leaf = _split(path)
            if leaf == OPAQUE:
                gone = parent in after.opaque or parent in after.files or after.hides(parent)
            elif leaf.startswith(WHITEOUT):
                target = f"{parent}/{leaf[len(WHITEOUT):]}".lstrip("/")
                if target in after.dirs:
                    make_opaque.add(target)  # base's content there stays hidden
                gone = target in after.paths or target in after.whiteouts or after.hides(target)
            elif member.isdir() and path in after.dirs:
                gone = after.hides(path)  # kept before its children; the newer one's comes later
            else:
                gone = path in after.paths or after.hides(path)
            if gone:
                dropped.add(path)
            else:
                kept.append(member)
        for member in kept:
            if member.islnk() and _norm(member.linkname) in dropped:
                source = old_tar.getmember(member.linkname)
                copy = tarfile.TarInfo(member.name)
                for field in ("mode", "uid", "gid", "uname", "gname", "mtime", "pax_headers"):
                    setattr(copy, field, getattr(member, field))
                copy.type, copy.size = tarfile.REGTYPE, source.size
                merged.addfile(copy, old_tar.extractfile(source))
                continue
            merged.addfile(member, old_tar.extractfile(member) if member.isreg() else None)
        for member in new_members:
            merged.addfile(member, new_tar.extractfile(member) if member.isreg() else None)
            path = _norm(member.name)
            if member.isdir() and path in make_opaque and path not in after.opaque:
                marker = tarfile.TarInfo(f"{member.name.rstrip('/')}/{OPAQUE}")
                marker.mtime, marker.mode = member.mtime, 0o644
                merged.addfile(marker)
