"""Per-container record directories under the state dir (`/run/torpor` by default).

    <state_dir>/containers/<namespace>/<id>/checkpoint-request.json
        `torpor checkpoint` leaves its request here for torpor-runc, which takes (removes) it:
        containerd passes runc's options through, but no torpor-specific ones
    <state_dir>/containers/<namespace>/<id>/restore-net.json
        torpor-runc restore leaves the network plan here for torpor-hook

`<namespace>` is containerd's namespace, read from the bundle path
(`.../io.containerd.runtime.v2.task/<namespace>/<id>`), or `_` for other engines. torpor-hook
imports this module on every container start: the standard library only, and the request's
typed format is imported only where a request is read or written.
"""

from __future__ import annotations

import os
import time

from torpor.atomicfile import write_atomic
from torpor.formats import names

TYPE_CHECKING = False  # torpor-hook runs on every container start: no typing, json or shutil
if TYPE_CHECKING:
    from torpor.formats.request import CheckpointRequest

REQUEST_TTL_S = 300


def container_key(bundle: str, container_id: str) -> str:
    bundle = os.path.normpath(bundle)
    namespace = "_"
    if os.path.basename(bundle) == container_id:
        namespace = os.path.basename(os.path.dirname(bundle)) or "_"
    return f"{namespace}/{container_id}"


def record_dir(state_dir: str, bundle: str, container_id: str) -> str:
    """The record directory of a container, from its bundle (what the runtime knows)."""
    return os.path.join(state_dir, names.RECORDS_DIR, container_key(bundle, container_id))


def containerd_record_dir(state_dir: str, namespace: str, container_id: str) -> str:
    """The record directory of a containerd container, from its namespace and id (what the
    CLI knows)."""
    return os.path.join(state_dir, names.RECORDS_DIR, namespace, container_id)


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


def write_request(directory: str, request: CheckpointRequest) -> str:
    from dataclasses import replace

    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, names.CHECKPOINT_REQUEST)
    write_atomic(path, replace(request, expires=time.time() + REQUEST_TTL_S).dumps(), mode=0o600)
    return path


def take_request(directory: str) -> CheckpointRequest | None:
    """The pending checkpoint request, removed as it is read; None when none or expired."""
    from torpor.formats.request import CheckpointRequest

    path = os.path.join(directory, names.CHECKPOINT_REQUEST)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        os.unlink(path)
    except OSError:
        pass
    request = CheckpointRequest.loads(data, path)
    if request.expires < time.time():
        return None
    return request
