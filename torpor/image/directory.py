"""The local checkpoint directory that `torpor checkpoint -o DIR` writes and `torpor restore`
reads (docs/checkpoint.md describes it for users):

    DIR/                      0700
      checkpoint.json         metadata: container, spec, image, options, node, sizes, timings
      criu/                   CRIU's images, as runc left them, plus criu/torpor/ from torpor-runc
                              (state.json, volumes/, devshm.tar)
      rootfs-diff.tar         the read-write layer: an OCI layer (uncompressed tar, whiteouts)

A restore checks the directory against checkpoint.json (every file there, with its size) before
touching containerd, and never writes into it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from torpor.atomicfile import write_atomic
from torpor.errors import RestoreError

FORMAT = "torpor.checkpoint.v1"
METADATA = "checkpoint.json"
CRIU_DIR = "criu"
ROOTFS_DIFF = "rootfs-diff.tar"


def inventory(directory: str) -> list[dict[str, Any]]:
    """Every regular file below `directory` with its size, sorted, relative paths."""
    files = []
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                files.append({"path": os.path.relpath(path, directory),
                              "size": os.path.getsize(path)})
    return files


def write_metadata(directory: str, metadata: dict[str, Any]) -> None:
    write_atomic(os.path.join(directory, METADATA),
                 json.dumps(metadata, indent=1, sort_keys=True).encode(), mode=0o600)


def load(directory: str) -> dict[str, Any]:
    """checkpoint.json, after checking that every file it lists is there, whole."""
    path = os.path.join(directory, METADATA)
    try:
        with open(path, "rb") as f:
            metadata: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        raise RestoreError(f"{directory} is not a torpor checkpoint: no {METADATA}") from None
    except (OSError, ValueError) as e:
        raise RestoreError(f"{path} is unreadable: {e}") from None
    if metadata.get("format") != FORMAT:
        raise RestoreError(f"{path} has format {metadata.get('format')!r}; this torpor reads "
                           f"{FORMAT!r}")
    problems = []
    for entry in metadata.get("files", []):
        rel = entry["path"]
        if rel.startswith("/") or ".." in rel.split("/"):
            raise RestoreError(f"{path} lists an unsafe path {rel!r}")
        full = os.path.join(directory, rel)
        try:
            size = os.path.getsize(full)
        except OSError:
            problems.append(f"{rel} is missing")
            continue
        if size != entry["size"]:
            problems.append(f"{rel} is {size} bytes, the checkpoint wrote {entry['size']}")
    if problems:
        shown = "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)" if len(problems) > 5
                                             else "")
        raise RestoreError(f"the checkpoint in {directory} is incomplete or damaged: {shown}")
    return metadata
