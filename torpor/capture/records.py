"""Per-container records under the state dir (`/run/torpor` by default).

    <state_dir>/containers/<namespace>/<id>/container.json   torpor-hook createRuntime writes it
    <state_dir>/containers/<namespace>/<id>/restore-net.json torpor-runc restore leaves it for the hook
    <state_dir>/containers/<namespace>/<id>/checkpoint-request.json
        `torpor checkpoint` leaves its options here for torpor-runc, which takes (removes) it:
        containerd passes runtime options through but no torpor-specific ones

`<namespace>` is containerd's namespace, read from the bundle path
(`.../io.containerd.runtime.v2.task/<namespace>/<id>`), or `_` for other engines. Stdlib only.
"""

from __future__ import annotations

import os
import time

from torpor import fastjson
from torpor.atomicfile import write_atomic

TYPE_CHECKING = False  # torpor-hook runs on every container start: no typing, json or shutil
if TYPE_CHECKING:
    from typing import Any

GPU_DEVICE_PREFIXES = ("/dev/nvidia", "/dev/dri/")


def container_key(bundle: str, container_id: str) -> str:
    bundle = os.path.normpath(bundle)
    namespace = "_"
    if os.path.basename(bundle) == container_id:
        namespace = os.path.basename(os.path.dirname(bundle)) or "_"
    return f"{namespace}/{container_id}"


def record_dir(state_dir: str, bundle: str, container_id: str) -> str:
    return os.path.join(state_dir, "containers", container_key(bundle, container_id))


def explicit_netns(spec: dict[str, Any]) -> str | None:
    """The network namespace path the spec names (a pod's), or None when runc makes one."""
    for ns in spec.get("linux", {}).get("namespaces", []):
        if ns.get("type") == "network":
            return str(ns.get("path") or "") or None
    return None


def netns_path_of(spec: dict[str, Any], pid: int) -> str:
    return explicit_netns(spec) or f"/proc/{pid}/ns/net"


def gpu_devices(spec: dict[str, Any]) -> list[str]:
    paths = [d.get("path", "") for d in spec.get("linux", {}).get("devices", [])]
    paths += [m.get("destination", "") for m in spec.get("mounts", [])]
    return sorted({p for p in paths if p.startswith(GPU_DEVICE_PREFIXES)})


def build_record(state: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    pid = int(state.get("pid") or 0)
    netns = netns_path_of(spec, pid)
    try:
        netns_inode = os.stat(netns).st_ino
    except OSError:
        netns_inode = 0
    own_netns = explicit_netns(spec) is None
    return {
        "id": state.get("id"),
        "pid": pid,
        "bundle": state.get("bundle"),
        "netns": {"path": netns, "inode": netns_inode, "created_by_runtime": own_netns},
        "mounts": spec.get("mounts", []),
        "gpu_devices": gpu_devices(spec),
        "annotations": state.get("annotations") or spec.get("annotations") or {},
    }


def write_record(directory: str, record: dict[str, Any]) -> str:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, "container.json")
    write_atomic(path, fastjson.dumps(record).encode(), mode=0o600, durable=False)  # /run
    return path


def read_record(directory: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(directory, "container.json"), "rb") as f:
            data: dict[str, Any] = fastjson.loads(f.read())
            return data
    except (OSError, ValueError):
        return None


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
    try:
        _remove_tree(directory)
    except OSError:
        pass
    parent = os.path.dirname(directory)
    try:
        os.rmdir(parent)  # the namespace directory, once empty
    except OSError:
        pass


CHECKPOINT_REQUEST = "checkpoint-request.json"
REQUEST_TTL_S = 300


def containerd_record_dir(state_dir: str, namespace: str, container_id: str) -> str:
    """The record directory of a containerd container, from its namespace and id."""
    return os.path.join(state_dir, "containers", namespace, container_id)


def write_request(directory: str, request: dict[str, Any]) -> str:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, CHECKPOINT_REQUEST)
    body = {**request, "expires": time.time() + REQUEST_TTL_S}
    write_atomic(path, fastjson.dumps(body).encode(), mode=0o600)
    return path


def take_request(directory: str) -> dict[str, Any]:
    """The pending checkpoint request, removed as it is read; {} when none or expired."""
    path = os.path.join(directory, CHECKPOINT_REQUEST)
    try:
        with open(path, "rb") as f:
            request: dict[str, Any] = fastjson.loads(f.read())
    except (OSError, ValueError):
        return {}
    try:
        os.unlink(path)
    except OSError:
        pass
    if float(request.get("expires", 0)) < time.time():
        return {}
    return request
