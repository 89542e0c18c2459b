"""The container's read-write layer as an OCI layer: from the overlay upperdir, with whiteouts.

overlayfs marks a deleted file with a 0/0 character device and a directory that hides its lower
content with the xattr `trusted.overlay.opaque=y`; an OCI layer says the same with `.wh.NAME`
and `.wh..wh..opq` entries (written first in their directory). Redirected or metacopy upper
directories are not a diff on their own, so they are refused rather than saved wrong.
"""

from __future__ import annotations

import os
import stat
import tarfile
from typing import BinaryIO

from torpor.archive import OPAQUE, WHITEOUT_PREFIX, tarinfo_for, walk
from torpor.errors import CheckpointError

OVERLAY_XATTRS = ("trusted.overlay.", "user.overlay.")


def _xattr(path: str, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError:
        return None


def _is_opaque(path: str) -> bool:
    return any(_xattr(path, f"{p}opaque") == b"y" for p in OVERLAY_XATTRS)


def _check_plain(path: str) -> None:
    for prefix in OVERLAY_XATTRS:
        for kind in ("redirect", "metacopy"):
            if _xattr(path, prefix + kind) is not None:
                raise CheckpointError(
                    f"the overlay upper directory uses {kind} ({path}): torpor cannot save it",
                    hint="mount overlay without redirect_dir/metacopy (containerd's default)")


def root_overlay(pid: int) -> dict[str, str] | None:
    """The overlay options (upperdir, lowerdir, workdir) of pid's root mount, if it is overlay."""
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(" ")
        if fields[4] != "/":
            continue
        sep = fields.index("-")
        if fields[sep + 1] != "overlay":
            return None
        options = {}
        for option in fields[sep + 3].split(","):
            key, _, value = option.partition("=")
            options[key] = value
        return options if "upperdir" in options else None
    return None


def write_layer(upperdir: str, out: BinaryIO) -> int:
    """Write the OCI layer for `upperdir` to `out`; returns the number of entries."""
    entries = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel, st in walk(upperdir):
            path = os.path.join(upperdir, rel)
            parent, name = os.path.split(rel)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                info = tarfile.TarInfo(os.path.join(parent, WHITEOUT_PREFIX + name))
                info.mtime = int(st.st_mtime)
                tar.addfile(info)
                entries += 1
                continue
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                raise CheckpointError(f"{rel} in the container's rootfs is a device, socket or "
                                      "FIFO: torpor cannot save it")
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                _check_plain(path)
            info = tarinfo_for(rel, st, path)
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
            entries += 1
            if info.isdir() and _is_opaque(path):
                marker = tarfile.TarInfo(os.path.join(rel, OPAQUE))
                marker.mtime = int(st.st_mtime)
                tar.addfile(marker)
                entries += 1
    return entries
