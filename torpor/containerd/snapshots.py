"""A container's read-write layer through containerd's snapshotter and diff service: taking it
out as a layer blob (snapshotters other than overlay, which torpor-runc reads itself) and
applying a saved one onto a new snapshot."""

from __future__ import annotations

import os
import secrets

from torpor.containerd.api import containers_pb2, types_pb2
from torpor.containerd.client import Client
from torpor.formats.digests import sha256_file
from torpor.formats.mediatypes import OCI_LAYER_TAR


def save_rw_layer(client: Client, container: containers_pb2.Container, out_path: str) -> None:
    """The changes of the container's snapshot over its image, as an OCI layer at `out_path`."""
    snapshotter, key = container.snapshotter, container.snapshot_key
    parent = client.stat_snapshot(snapshotter, key).parent
    view = f"torpor-diff-{container.id}-{secrets.token_hex(4)}"
    with client.lease():
        left = client.view_snapshot(snapshotter, view, parent)
        try:
            right = client.snapshot_mounts(snapshotter, key)
            layer = client.diff(left, right, OCI_LAYER_TAR, f"torpor-rootfs-{container.id}")
        finally:
            client.remove_snapshot(snapshotter, view)
        fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            for chunk in client.read_content(layer.digest):
                out.write(chunk)


def apply_rw_layer(client: Client, path: str, mounts: list[types_pb2.Mount]) -> None:
    """Apply a saved read-write layer (an uncompressed OCI layer) onto prepared mounts."""
    size = os.path.getsize(path)
    digest = sha256_file(path)
    client.write_file(f"torpor-rootfs-{digest}", path, size, digest)
    client.apply_diff(types_pb2.Descriptor(media_type=OCI_LAYER_TAR, digest=digest, size=size),
                      mounts)
