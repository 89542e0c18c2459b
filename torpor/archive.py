"""Tar archives in and out of torpor: writing directories, and extracting without escaping.

Every extraction stays inside its target directory. Refused, with UnsafeArchive naming the
entry: absolute names, `..` components, writing through a symlink, hard links or relative
symlinks that point outside, device nodes and FIFOs (everywhere), and in `strict` mode anything
but regular files and directories (CRIU image parts). Absolute symlink targets are allowed in
`rootfs` and `volume` modes: they are data, read relative to the container's root, and never
followed here.

`layer` mode applies OCI whiteouts: `.wh.NAME` deletes NAME below the target, and `.wh..wh..opq`
empties its directory of what was there before the layer, whatever the entry order.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from typing import BinaryIO, Literal

from torpor.errors import UnsafeArchive

Mode = Literal["strict", "volume", "layer"]
WHITEOUT_PREFIX = ".wh."
OPAQUE = ".wh..wh..opq"


def safe_name(name: str, what: str = "archive entry") -> str:
    """`name` as a plain relative path ('a/./b/' -> 'a/b'), or UnsafeArchive for an absolute
    path or a '..' component: the one check of every name torpor takes from an archive or a
    checkpoint's file list before it becomes a path."""
    if name.startswith("/") or name.startswith("\\"):
        raise UnsafeArchive(f"{what} {name!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise UnsafeArchive(f"{what} {name!r} contains '..'")
    return "/".join(parts)


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _check_parents(root: str, rel: str) -> None:
    """No directory on the way to `rel` may be a symlink: we would write through it."""
    current = root
    for part in rel.split("/")[:-1]:
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeArchive(f"archive entry {rel!r} would be written through the symlink "
                                f"{os.path.relpath(current, root)!r}")


def _remove(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _validate(member: tarfile.TarInfo, rel: str, root: str, mode: Mode) -> None:
    if member.isdev() or member.isfifo():
        raise UnsafeArchive(f"archive entry {member.name!r} is a device node or FIFO")
    if mode == "strict" and not (member.isfile() or member.isdir()):
        raise UnsafeArchive(f"archive entry {member.name!r} is a link; only files are allowed here")
    if member.islnk():
        target = safe_name(member.linkname)
        if not _inside(root, os.path.normpath(os.path.join(root, target))):
            raise UnsafeArchive(f"hard link {member.name!r} points outside the archive")
    if member.issym() and not member.linkname.startswith("/"):
        resolved = os.path.normpath(os.path.join(root, os.path.dirname(rel), member.linkname))
        if not _inside(root, resolved):
            raise UnsafeArchive(f"symlink {member.name!r} -> {member.linkname!r} points outside "
                                "the archive")


def extract(source: str | BinaryIO, target: str, mode: Mode = "volume") -> int:
    """Extract the tar `source` (path or file object) into `target`; returns entries written."""
    root = os.path.realpath(target)
    os.makedirs(root, exist_ok=True)
    try:
        tar = tarfile.open(source, "r:") if isinstance(source, str) else tarfile.open(
            fileobj=source, mode="r:")
    except tarfile.TarError as e:
        raise UnsafeArchive(f"not a readable tar archive: {e}") from None
    written = 0
    with tar:
        try:
            members = tar.getmembers()
        except (tarfile.TarError, EOFError) as e:
            raise UnsafeArchive(f"truncated or corrupt tar archive: {e}") from None
        entries = [(m, safe_name(m.name)) for m in members]
        for member, rel in entries:
            if rel:
                _validate(member, rel, root, mode)
        if mode == "layer":
            entries = _apply_whiteouts(root, entries)
        dirs: list[tuple[str, tarfile.TarInfo]] = []
        for member, rel in entries:
            if not rel:
                continue
            _check_parents(root, rel)
            path = os.path.join(root, rel)
            try:
                _extract_one(tar, member, path, root)
            except (OSError, tarfile.TarError, EOFError) as e:
                raise UnsafeArchive(f"cannot extract {member.name!r}: {e}") from None
            if member.isdir():
                dirs.append((path, member))
            written += 1
        for path, member in reversed(dirs):  # directory times and modes once their content is in
            os.chmod(path, member.mode & 0o7777)
            os.utime(path, (member.mtime, member.mtime))
    return written


def _apply_whiteouts(root: str, entries: list[tuple[tarfile.TarInfo, str]]
                     ) -> list[tuple[tarfile.TarInfo, str]]:
    kept = []
    for member, rel in entries:
        name = os.path.basename(rel)
        parent = os.path.dirname(rel)
        if name == OPAQUE:
            _check_parents(root, rel)
            directory = os.path.join(root, parent)
            if os.path.isdir(directory) and not os.path.islink(directory):
                for child in os.listdir(directory):
                    _remove(os.path.join(directory, child))
        elif name.startswith(WHITEOUT_PREFIX):
            _check_parents(root, rel)
            _remove(os.path.join(root, parent, name[len(WHITEOUT_PREFIX):]))
        else:
            kept.append((member, rel))
    return kept


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, path: str, root: str) -> None:
    if member.isdir():
        if os.path.lexists(path) and not os.path.isdir(path):
            _remove(path)
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.lchown(path, member.uid, member.gid)
        return
    if os.path.lexists(path):
        _remove(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if member.issym():
        os.symlink(member.linkname, path)
        os.lchown(path, member.uid, member.gid)
        return
    if member.islnk():
        os.link(os.path.join(root, safe_name(member.linkname)), path, follow_symlinks=False)
        return
    source = tar.extractfile(member)
    if source is None:
        raise UnsafeArchive(f"archive entry {member.name!r} has no data")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(source, out, 1 << 20)
        if out.tell() != member.size:
            raise UnsafeArchive(f"archive entry {member.name!r} is truncated")
    os.chown(path, member.uid, member.gid)
    os.chmod(path, member.mode & 0o7777)
    os.utime(path, (member.mtime, member.mtime))


# Writing ------------------------------------------------------------------------------------

def walk(root: str) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) for everything below root, parents before children, sorted."""
    stack = [""]
    while stack:
        rel = stack.pop()
        directory = os.path.join(root, rel)
        try:
            names = sorted(os.listdir(directory), reverse=True)
        except FileNotFoundError:
            continue
        for name in names:
            child = f"{rel}/{name}" if rel else name
            st = os.lstat(os.path.join(root, child))
            if stat.S_ISDIR(st.st_mode):
                stack.append(child)
        for name in reversed(names):
            child = f"{rel}/{name}" if rel else name
            try:
                yield child, os.lstat(os.path.join(root, child))
            except FileNotFoundError:
                continue


def tarinfo_for(rel: str, st: os.stat_result, path: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(rel)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.mtime = int(st.st_mtime)
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        info.type = tarfile.REGTYPE
        info.size = st.st_size
    else:
        raise UnsafeArchive(f"{path} is a device, socket or FIFO: not saved")
    return info


def write_tree(root: str, out: BinaryIO, skip_special: bool = True) -> int:
    """Tar the contents of `root` (not following symlinks) to `out`; returns bytes of file data."""
    data = 0
    seen: dict[tuple[int, int], str] = {}
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel, st in walk(root):
            path = os.path.join(root, rel)
            plain = stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode)
            if not plain and skip_special:
                continue
            info = tarinfo_for(rel, st, path)
            key = (st.st_dev, st.st_ino)
            if info.isfile() and st.st_nlink > 1 and key in seen:
                info.type, info.linkname, info.size = tarfile.LNKTYPE, seen[key], 0
                tar.addfile(info)
                continue
            if info.isfile():
                seen[key] = rel
                with open(path, "rb") as f:
                    tar.addfile(info, f)
                data += info.size
            else:
                tar.addfile(info)
    return data
