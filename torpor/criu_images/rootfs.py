"""Whether the paths a dump reaches on the container's root mount are in the root filesystem it
is restored onto: each path resolved inside the rootfs as the container sees it (a symlink,
absolute or relative, never leads out of it; `..` stops at its root), nothing opened or
followed on the host. An open file must be there; what CRIU makes on restore (a unix socket, a
ghost file) needs its directory there."""

from __future__ import annotations

import os
import posixpath
import stat

from torpor.criu_images.checks import Finding
from torpor.criu_images.dump import Dump

MAX_SYMLINKS = 40


def findings(dump: Dump, rootfs: str) -> list[Finding]:
    roots = {m.mnt_id for m in dump.mounts if posixpath.normpath(m.mountpoint) == "/"}
    out: list[Finding] = []
    for use in dump.paths:
        if use.mnt_id >= 0 and dump.mounts and use.mnt_id not in roots:
            continue   # on another mount: checks.py
        wanted = posixpath.dirname(posixpath.normpath(use.path)) if use.created else use.path
        if not exists_inside(rootfs, wanted):
            out.append(Finding(f"{use.what} {use.path}, which is not in the container's root "
                               "filesystem" + (" (nor its directory)" if use.created else ""),
                               "none: the checkpoint's processes only reach what their "
                               "container has"))
    return out


def exists_inside(rootfs: str, path: str) -> bool:
    """Whether `path`, as the container resolves it, names something in `rootfs`."""
    todo = [p for p in path.split("/") if p]
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        host = os.path.join(rootfs, *done, part)
        try:
            st = os.lstat(host)
        except OSError:
            return False
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                return False
            target = os.readlink(host)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p] + todo
            continue
        if todo and not stat.S_ISDIR(st.st_mode):
            return False
        done.append(part)
    return True
