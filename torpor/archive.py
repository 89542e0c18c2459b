"""Tar archives in and out of torpor: writing directories, and extracting without escaping.

Every extraction stays inside its target directory, whatever the archive says and whatever the
target already holds. The target is opened once; every path below it is reached one component
at a time from its parent's file descriptor with O_NOFOLLOW (`os.open(..., dir_fd=...)`), so no
symlink is ever followed, one already there or one the archive made a moment before. Modes,
owners and times are set through the file's own descriptor.

Checked before anything is written (a refused archive writes nothing), with UnsafeArchive
naming the entry: absolute names and `..` components; hard links whose target is absolute or has
`..` (a link is made from inside the target only); relative symlinks that point outside (absolute
symlink targets are data, read relative to the container's root, and allowed in `volume` and
`layer` modes); device nodes and FIFOs unless the caller allows them; sparse entries; in
`strict` mode anything but regular files and directories; more entries or bytes than the limits.

`layer` mode applies OCI whiteouts: `.wh.NAME` deletes NAME in its directory (never `.`, `..`
or an empty name) and `.wh..wh..opq` empties its directory of what was there before the layer,
whatever the entry order; other `.wh..wh.` names (aufs' own) are refused.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Literal

from torpor.errors import UnsafeArchive

Mode = Literal["strict", "volume", "layer"]
WHITEOUT_PREFIX = ".wh."
OPAQUE = ".wh..wh..opq"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class ArchiveLimits:
    """How much one archive may hold: entries, and bytes of file data."""

    max_entries: int = 1_000_000
    max_bytes: int = 1 << 40


def safe_name(name: str, what: str = "archive entry") -> str:
    """`name` as a plain relative path ('a/./b/' -> 'a/b'), or UnsafeArchive for an absolute
    path or a '..' component: the one check of every name torpor takes from an archive or a
    checkpoint's file list before it becomes a path."""
    if name.startswith("/") or name.startswith("\\"):
        raise UnsafeArchive(f"{what} {name!r} has an absolute path")
    if "\0" in name:
        raise UnsafeArchive(f"{what} {name!r} contains a NUL byte")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise UnsafeArchive(f"{what} {name!r} contains '..'")
    return "/".join(parts)


def whiteout_target(name: str) -> str | None:
    """The name a whiteout entry's basename deletes; None when it is not a whiteout; OPAQUE for
    the opaque marker. UnsafeArchive for whiteouts of '.', '..', '' and aufs' own names."""
    if not name.startswith(WHITEOUT_PREFIX):
        return None
    if name == OPAQUE:
        return OPAQUE
    target = name[len(WHITEOUT_PREFIX):]
    if target in ("", ".", "..") or target.startswith(WHITEOUT_PREFIX):
        raise UnsafeArchive(f"whiteout {name!r} names {target or 'nothing'!r}: refused")
    return target


# Checking ------------------------------------------------------------------------------------

def _validate(member: tarfile.TarInfo, rel: str, mode: Mode, devices: bool) -> None:
    if member.issparse():
        raise UnsafeArchive(f"archive entry {member.name!r} is a sparse file: refused")
    if member.isdev() or member.isfifo():
        if not devices or mode == "strict":
            raise UnsafeArchive(f"archive entry {member.name!r} is a device node or FIFO: "
                                "refused by this node's policy")
    elif mode == "strict" and not (member.isfile() or member.isdir()):
        raise UnsafeArchive(f"archive entry {member.name!r} is a link; only files are allowed here")
    elif not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchive(f"archive entry {member.name!r} is of unknown type {member.type!r}")
    if member.islnk() and not safe_name(member.linkname, f"hard link {member.name!r} to"):
        raise UnsafeArchive(f"hard link {member.name!r} points at the target itself")
    if member.issym():
        if not member.linkname or "\0" in member.linkname:
            raise UnsafeArchive(f"symlink {member.name!r} has no valid target")
        if not member.linkname.startswith("/"):
            depth = len(rel.split("/")) - 1
            for part in member.linkname.split("/"):
                depth += -1 if part == ".." else (0 if part in ("", ".") else 1)
                if depth < 0:
                    raise UnsafeArchive(f"symlink {member.name!r} -> {member.linkname!r} points "
                                        "outside the archive")
    if mode == "layer":
        whiteout_target(os.path.basename(rel))


def read_members(tar: tarfile.TarFile, mode: Mode, devices: bool, limits: ArchiveLimits,
                 archive_size: int | None) -> list[tuple[tarfile.TarInfo, str]]:
    """Every entry with its safe relative name, checked, within the limits."""
    entries: list[tuple[tarfile.TarInfo, str]] = []
    total = 0
    try:
        for member in tar:
            if len(entries) >= limits.max_entries:
                raise UnsafeArchive(f"the archive has more than {limits.max_entries} entries, "
                                    "the limit ([restore] max_files)")
            rel = safe_name(member.name)
            if rel:
                _validate(member, rel, mode, devices)
            if member.isfile():
                total += member.size
                if total > limits.max_bytes or (archive_size is not None and
                                                total > archive_size):
                    raise UnsafeArchive(f"the archive's files add up to more than "
                                        f"{min(limits.max_bytes, archive_size or limits.max_bytes)}"
                                        " bytes, more than it can hold or the limit allows")
            entries.append((member, rel))
    except (tarfile.TarError, EOFError) as e:
        raise UnsafeArchive(f"truncated or corrupt tar archive: {e}") from None
    return entries


# The target, reached one component at a time ----------------------------------------------

class Target:
    """A directory held open; paths below it are opened component by component (O_NOFOLLOW)."""

    def __init__(self, path: str, create: bool = True) -> None:
        self.path = os.path.realpath(path)
        if create:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        self.fd = os.open(self.path, _DIR_FLAGS)

    def close(self) -> None:
        os.close(self.fd)

    def open_dir(self, rel: str, create: bool = False) -> int:
        """A new descriptor of the directory `rel` ('' is the target); never through a symlink."""
        fd = os.dup(self.fd)
        walked = []
        for part in [p for p in rel.split("/") if p]:
            walked.append(part)
            try:
                if create:
                    try:
                        os.mkdir(part, 0o700, dir_fd=fd)
                    except FileExistsError:
                        pass
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise UnsafeArchive(f"{'/'.join(walked)!r} in {self.path} is a symlink or a "
                                    "file, not a directory: nothing is written through it") \
                    from None
            os.close(fd)
            fd = child
        return fd

    def parent(self, rel: str, create: bool = True) -> tuple[int, str]:
        head, _, name = rel.rpartition("/")
        return self.open_dir(head, create), name


def remove_at(dir_fd: int, name: str) -> None:
    """Remove `name` in the directory `dir_fd` (a tree, a file, a link), following nothing."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _empty_dir(target: Target, rel: str) -> None:
    try:
        fd = target.open_dir(rel)
    except FileNotFoundError:
        return
    try:
        for child in os.listdir(fd):
            remove_at(fd, child)
    finally:
        os.close(fd)


# Extracting ----------------------------------------------------------------------------------

def extract(source: str, target: str, mode: Mode = "volume", *, devices: bool = False,
            limits: ArchiveLimits | None = None, setid: bool = True) -> int:
    """Extract the tar file `source` into `target`; returns entries written. A directory that
    extract made is removed again if extraction fails. `setid=False`: no setuid or setgid bit
    is written (content from whoever made the archive, into a place another chose)."""
    limits = limits or ArchiveLimits()
    made = not os.path.exists(target)
    try:
        tar = tarfile.open(source, "r:")
    except (tarfile.TarError, OSError) as e:
        raise UnsafeArchive(f"{source} is not a readable tar archive: {e}") from None
    try:
        with tar:
            entries = read_members(tar, mode, devices, limits, os.path.getsize(source))
            if not setid:
                for member, _ in entries:
                    member.mode &= ~(stat.S_ISUID | stat.S_ISGID)
            root = Target(target)
            try:
                return _write_all(tar, root, entries, mode)
            finally:
                root.close()
    except BaseException:
        if made:
            shutil.rmtree(target, ignore_errors=True)
        raise


def _write_all(tar: tarfile.TarFile, root: Target,
               entries: list[tuple[tarfile.TarInfo, str]], mode: Mode) -> int:
    if mode == "layer":
        entries = _apply_whiteouts(root, entries)
    dirs: list[tuple[str, tarfile.TarInfo]] = []
    written = 0
    for member, rel in entries:
        if not rel:
            continue
        try:
            _extract_one(tar, root, member, rel)
        except UnsafeArchive:
            raise
        except (OSError, tarfile.TarError, EOFError) as e:
            raise UnsafeArchive(f"cannot extract {member.name!r}: {e}") from None
        if member.isdir():
            dirs.append((rel, member))
        written += 1
    for rel, member in reversed(dirs):  # directory modes and times once their content is in
        fd = root.open_dir(rel)
        try:
            os.fchown(fd, member.uid, member.gid)
            os.fchmod(fd, member.mode & 0o7777)
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)
    return written


def _apply_whiteouts(root: Target, entries: list[tuple[tarfile.TarInfo, str]]
                     ) -> list[tuple[tarfile.TarInfo, str]]:
    kept = []
    for member, rel in entries:
        deleted = whiteout_target(os.path.basename(rel)) if rel else None
        parent = os.path.dirname(rel)
        if deleted == OPAQUE:
            _empty_dir(root, parent)
        elif deleted is not None:
            try:
                fd = root.open_dir(parent)
            except FileNotFoundError:
                continue
            try:
                remove_at(fd, deleted)
            finally:
                os.close(fd)
        else:
            kept.append((member, rel))
    return kept


def _extract_one(tar: tarfile.TarFile, root: Target, member: tarfile.TarInfo, rel: str) -> None:
    parent, name = root.parent(rel)
    try:
        if member.isdir():
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    remove_at(parent, name)
                    os.mkdir(name, 0o700, dir_fd=parent)
            except FileNotFoundError:
                os.mkdir(name, 0o700, dir_fd=parent)
            return
        remove_at(parent, name)
        if member.issym():
            os.symlink(member.linkname, name, dir_fd=parent)
            os.chown(name, member.uid, member.gid, dir_fd=parent, follow_symlinks=False)
            os.utime(name, (member.mtime, member.mtime), dir_fd=parent, follow_symlinks=False)
        elif member.islnk():
            source_parent, source_name = root.parent(safe_name(member.linkname), create=False)
            try:
                os.link(source_name, name, src_dir_fd=source_parent, dst_dir_fd=parent,
                        follow_symlinks=False)
            finally:
                os.close(source_parent)
        elif member.isdev() or member.isfifo():
            kind = {tarfile.CHRTYPE: stat.S_IFCHR, tarfile.BLKTYPE: stat.S_IFBLK}.get(
                member.type, stat.S_IFIFO)
            os.mknod(name, kind | 0o600, os.makedev(member.devmajor, member.devminor),
                     dir_fd=parent)
            node = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            try:  # through the node's own descriptor: never opened, never a symlink
                os.chown(f"/proc/self/fd/{node}", member.uid, member.gid)
                os.chmod(f"/proc/self/fd/{node}", member.mode & 0o7777)
            finally:
                os.close(node)
        else:
            _write_file(tar, member, parent, name)
    finally:
        os.close(parent)


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, parent: int, name: str) -> None:
    source = tar.extractfile(member)
    if source is None:
        raise UnsafeArchive(f"archive entry {member.name!r} has no data")
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=parent)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(source, out, 1 << 20)
        if out.tell() != member.size:
            raise UnsafeArchive(f"archive entry {member.name!r} is truncated")
        out.flush()
        os.fchown(fd, member.uid, member.gid)
        os.fchmod(fd, member.mode & 0o7777)
        os.utime(fd, (member.mtime, member.mtime))


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
