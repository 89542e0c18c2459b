"""Hostile archives and specs, the way an attacker would write them into a checkpoint: tar
entries that try to leave their target (symlinks, hard links, whiteouts, `..`, absolute names),
device nodes, decompression bombs, and spec edits that ask a restoring node for more than it
should give. Used by the unit tests (torpor.archive alone) and by the hostile corpus
(tests/test_hostile_checkpoints.py, on real checkpoints).

A canary tree stands outside every target; `tree_digest` fingerprints it (names, types, modes,
owners, link counts, ctimes, content, link targets) so that any write, chmod, link or delete
there shows.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

import zstandard

UP = "../" * 24   # more '..' than any target is deep


def entry(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", data: bytes = b"",
          mode: int = 0o644, major: int = 0, minor: int = 0) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    info.devmajor, info.devminor = major, minor
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def tar_bytes(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    return out.getvalue()


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data)


def zstd_bomb_tar(name: str, size: int, level: int = 19) -> bytes:
    """A tar+zstd layer holding one file of `size` zero bytes, compressed as small as zstd makes
    it (4 GiB to about 131 KB), written without holding the tar in memory."""
    header = tarfile.TarInfo(name)
    header.size = size
    out = io.BytesIO()
    compressor = zstandard.ZstdCompressor(level=level)
    with compressor.stream_writer(out, closefd=False) as writer:
        writer.write(header.tobuf(format=tarfile.PAX_FORMAT))
        zeros = bytes(1 << 20)
        left = size
        while left:
            n = min(left, len(zeros))
            writer.write(zeros[:n])
            left -= n
        writer.write(bytes(-size % 512))
        writer.write(bytes(1024))
    return out.getvalue()


def archive_escapes(canary: Path) -> dict[str, tuple[str, list[tuple[tarfile.TarInfo, bytes]]]]:
    """name -> (extraction mode, entries): archives that try to reach `canary` (a directory
    holding `secret` and `victim/`) from wherever they are extracted."""
    c = str(canary)
    rel = UP + c.lstrip("/")
    return {
        "symlink-then-write-through": ("volume", [
            entry("link", tarfile.SYMTYPE, c), entry("link/secret", data=b"overwritten")]),
        "symlink-dir-then-chmod": ("volume", [
            entry("victim", tarfile.SYMTYPE, f"{c}/victim"),
            entry("victim", tarfile.DIRTYPE, mode=0o777)]),
        "relative-symlink-out": ("volume", [entry("out", tarfile.SYMTYPE, rel)]),
        "hardlink-dotdot": ("volume", [entry("h", tarfile.LNKTYPE, f"{rel}/secret")]),
        "hardlink-absolute": ("volume", [entry("h", tarfile.LNKTYPE, f"{c}/secret")]),
        "hardlink-through-symlink": ("volume", [
            entry("link", tarfile.SYMTYPE, c), entry("h", tarfile.LNKTYPE, "link/secret")]),
        "dotdot-name": ("volume", [entry(f"{rel}/dotdot-escaped", data=b"x")]),
        "absolute-name": ("volume", [entry(f"{c}/absolute-escaped", data=b"x")]),
        "char-device": ("volume", [entry("null", tarfile.CHRTYPE, major=1, minor=3)]),
        "block-device": ("volume", [entry("disk", tarfile.BLKTYPE, major=8, minor=0)]),
        "fifo": ("volume", [entry("pipe", tarfile.FIFOTYPE)]),
        "whiteout-dot": ("layer", [entry("etc/.wh..")]),
        "whiteout-dotdot": ("layer", [entry("etc/.wh...")]),
        "whiteout-empty": ("layer", [entry(".wh.")]),
        "whiteout-through-symlink": ("layer", [
            entry("link", tarfile.SYMTYPE, c), entry("link/.wh.secret")]),
        "opaque-through-symlink": ("layer", [
            entry("link", tarfile.SYMTYPE, c), entry("link/.wh..wh..opq")]),
        "aufs-whiteout": ("layer", [entry(".wh..wh.plnk")]),
        "layer-symlink-then-write": ("layer", [
            entry("etc2", tarfile.SYMTYPE, c), entry("etc2/secret", data=b"overwritten")]),
    }


def tree_digest(root: Path) -> str:
    """A fingerprint of everything below `root`, metadata included; reading changes nothing."""
    hasher = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            hasher.update(f"{os.path.relpath(path, root)} {st.st_mode:o} {st.st_uid} {st.st_gid} "
                          f"{st.st_nlink} {st.st_size} {st.st_ctime_ns} {st.st_mtime_ns}\n"
                          .encode())
            if stat.S_ISLNK(st.st_mode):
                hasher.update(os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                hasher.update(Path(path).read_bytes())
    st = os.lstat(root)
    hasher.update(f"{st.st_mode:o} {st.st_nlink} {st.st_ctime_ns}".encode())
    return hasher.hexdigest()


def make_canary(root: Path) -> Path:
    """A canary tree: `secret` (0600), `victim/` with a file, a file the attacks aim at."""
    root.mkdir(parents=True, mode=0o755)
    (root / "secret").write_text("the host's secret\n")
    (root / "secret").chmod(0o600)
    (root / "victim").mkdir(mode=0o755)
    (root / "victim" / "keep").write_text("kept\n")
    return root
