"""Per-container records under the state dir (`/run/torpor` by default).

    <state_dir>/containers/<namespace>/<id>/container.json    written by torpor-hook createRuntime
    <state_dir>/containers/<namespace>/<id>/restore-net.json  left by torpor-runc restore for the hook

`<namespace>` is containerd's namespace, read from the bundle path
(`.../io.containerd.runtime.v2.task/<namespace>/<id>`), or `_` for other engines. Stdlib only.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from torpor.shim.spec import write_atomic

GPU_DEVICE_PREFIXES = ("/dev/nvidia", "/dev/dri/")


def container_key(bundle: str, container_id: str) -> str:
    bundle = os.path.normpath(bundle)
    namespace = "_"
    if os.path.basename(bundle) == container_id:
        namespace = os.path.basename(os.path.dirname(bundle)) or "_"
    return f"{namespace}/{container_id}"


def record_dir(state_dir: str, bundle: str, container_id: str) -> str:
    return os.path.join(state_dir, "containers", container_key(bundle, container_id))


def netns_path_of(spec: dict[str, Any], pid: int) -> str:
    for ns in spec.get("linux", {}).get("namespaces", []):
        if ns.get("type") == "network":
            return str(ns.get("path") or f"/proc/{pid}/ns/net")
    return f"/proc/{pid}/ns/net"


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
    own_netns = not any(
        ns.get("type") == "network" and ns.get("path")
        for ns in spec.get("linux", {}).get("namespaces", [])
    )
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
    write_atomic(path, json.dumps(record, indent=1).encode(), mode=0o600)
    return path


def read_record(directory: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(directory, "container.json"), "rb") as f:
            data: dict[str, Any] = json.load(f)
            return data
    except (OSError, ValueError):
        return None


def remove_record(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    parent = os.path.dirname(directory)
    try:
        os.rmdir(parent)  # the namespace directory, once empty
    except OSError:
        pass
