"""What torpor-runc keeps in a checkpoint's image directory, beside CRIU's own files.

    <image-path>/torpor/state.json        the container's torpor state (written last)
    <image-path>/torpor/rootfs-diff.tar   the read-write layer, OCI layer with whiteouts
    <image-path>/torpor/volumes/N.tar     bind-mounted volumes
    <image-path>/torpor/devshm.tar        a bind-mounted /dev/shm

containerd tars the whole image directory into its checkpoint blob, so all of this travels
inside `ctr c checkpoint` images too and comes back in the directory `restore` is given.
Everything here is the workload's data: files 0600, folders 0700.
"""

from __future__ import annotations

import json
import os
from typing import Any

from torpor.atomicfile import write_atomic

STATE_DIR = "torpor"
STATE = "state.json"
ROOTFS_DIFF = "rootfs-diff.tar"
FORMAT = "torpor.container-state.v1"


def state_dir(image_path: str) -> str:
    return os.path.join(image_path, STATE_DIR)


def ensure(image_path: str) -> str:
    path = state_dir(image_path)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def write_json(path: str, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True).encode(), mode=0o600)


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            data: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        return None
    return data


def read_state(image_path: str) -> dict[str, Any] | None:
    return read_json(os.path.join(state_dir(image_path), STATE))
