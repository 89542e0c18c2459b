"""Per-container record directories under the state dir (`/run/torpor` by default).

    <state_dir>/containers/<namespace>/<id>.<key>/restore-net.json
        torpor-runc restore leaves the network plan here for torpor-hook

`<namespace>` is containerd's namespace, read from the bundle path
(`.../io.containerd.runtime.v2.task/<namespace>/<id>`), or `_` for other engines; `<key>` is a
hash of the bundle path, which holds containerd's state directory: two containerd instances on
one host (or two engines) never share a record, even for the same namespace and name.
torpor-hook imports this module on every container start: the standard library only.

A checkpoint's own files (its request, journal and locks) live apart, one directory per
checkpoint: torpor.capture.journal.
"""

from __future__ import annotations

import os
import zlib

from torpor.formats import names


def container_key(bundle: str, container_id: str) -> str:
    """`namespace/id.crc32(bundle)`, the bundle's real path: runc's OCI state (what hooks are
    given) names the directory runc found itself in after chdir, symlinks resolved (a bundle
    under /var/run is under /run there), where the runtime was given the path as the engine
    wrote it."""
    bundle = os.path.realpath(bundle)
    namespace = "_"
    if os.path.basename(bundle) == container_id:
        namespace = os.path.basename(os.path.dirname(bundle)) or "_"
    return f"{namespace}/{container_id}.{zlib.crc32(bundle.encode()):08x}"


def record_dir(state_dir: str, bundle: str, container_id: str) -> str:
    """The record directory of a container, from its bundle (what the runtime and hooks know)."""
    return os.path.join(state_dir, names.RECORDS_DIR, container_key(bundle, container_id))


def _remove_tree(path: str) -> None:
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        os.unlink(path)
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            _remove_tree(entry.path)
        else:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass


def remove_record(directory: str) -> None:
    """Remove a container's record directory, and its namespace's once empty."""
    try:
        _remove_tree(directory)
    except OSError:
        pass
    parent = os.path.dirname(directory)
    try:
        os.rmdir(parent)
    except OSError:
        pass
