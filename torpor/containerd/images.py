"""Images in containerd's content store: manifests, configs, chain IDs, unpacking into snapshots."""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform as host_platform
import secrets
from typing import Any

from torpor.containerd.api import types_pb2
from torpor.containerd.client import Client
from torpor.errors import AlreadyExists, ImageError, NotFound
from torpor.formats.digests import verify_bytes
from torpor.formats.mediatypes import INDEX_TYPES
from torpor.formats.metadata import BaseImage
from torpor.formats.oci import Descriptor, OciDocument
from torpor.node.facts import go_arch

MAX_JSON_BLOB = 4 << 20


def read_json(client: Client, digest: str) -> OciDocument:
    """An OCI document (manifest, index, config) from containerd's content store, digest-checked;
    kept as a dict because its unknown fields must survive."""
    data = bytearray()
    for chunk in client.read_content(digest):
        data += chunk
        if len(data) > MAX_JSON_BLOB:
            raise ImageError(f"blob {digest} is larger than {MAX_JSON_BLOB} bytes: not a manifest")
    verify_bytes(bytes(data), digest, f"content {digest} in containerd")
    try:
        parsed: dict[str, Any] = json.loads(data)
    except ValueError:
        raise ImageError(f"blob {digest} is not JSON") from None
    return parsed


def platform_manifest(client: Client, target: Descriptor) -> tuple[Descriptor, OciDocument]:
    """(manifest descriptor, manifest) for this node's platform under `target`."""
    doc = read_json(client, target.digest)
    if target.media_type in INDEX_TYPES or doc.get("manifests"):
        arch, os_name = go_arch(), host_platform.system().lower()
        for i, entry in enumerate(doc.get("manifests", [])):
            child = Descriptor.from_json(entry, f"image index {target.digest} manifests[{i}]")
            plat = child.platform or {}
            if plat.get("architecture") == arch and plat.get("os") == os_name:
                return child, read_json(client, child.digest)
        raise ImageError(f"image index {target.digest} has no manifest for {os_name}/{arch}")
    return target, doc


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The snapshot names of an image's layers: chain(n) = sha256(chain(n-1) + ' ' + diff(n))."""
    chain: list[str] = []
    for diff_id in diff_ids:
        if not chain:
            chain.append(diff_id)
        else:
            chain.append("sha256:" + hashlib.sha256(f"{chain[-1]} {diff_id}".encode()).hexdigest())
    return chain


def image_chain(client: Client, image_name: str) -> BaseImage:
    """Digests and chain ID of an image present in containerd."""
    image = client.get_image(image_name)
    target = Descriptor(image.target.media_type, image.target.digest, image.target.size)
    manifest_desc, manifest = platform_manifest(client, target)
    config_desc = Descriptor.from_json(manifest.get("config"), f"manifest {manifest_desc.digest}")
    config = read_json(client, config_desc.digest)
    diff_ids = [str(d) for d in (config.get("rootfs") or {}).get("diff_ids", [])]
    layers = [Descriptor.from_json(layer, f"manifest {manifest_desc.digest} layers[{i}]")
              for i, layer in enumerate(manifest.get("layers", []))]
    chain = chain_ids(diff_ids)
    return BaseImage(name=image_name, target=target, manifest=manifest_desc,
                     config_digest=config_desc.digest, layers=tuple(layers),
                     diff_ids=tuple(diff_ids), chain_id=chain[-1] if chain else "")


def ensure_unpacked(client: Client, snapshotter: str, chain: BaseImage) -> int:
    """Unpack the image's layers into `snapshotter` where missing; returns layers applied."""
    applied = 0
    ids = chain_ids(list(chain.diff_ids))
    parent = ""
    for layer, chain_id in zip(chain.layers, ids, strict=True):
        if not client.has_snapshot(snapshotter, chain_id):
            # a key of its own: a restore of the same image may be unpacking it at this moment
            # (containerd's unpacker does the same); the first to commit wins, the others
            # drop theirs. A key a crash left goes with its lease.
            key = f"torpor-unpack-{chain_id}-{secrets.token_hex(4)}"
            mounts = client.prepare_snapshot(snapshotter, key, parent)
            try:
                client.apply_diff(types_pb2.Descriptor(
                    media_type=layer.media_type, digest=layer.digest, size=layer.size), mounts)
                client.commit_snapshot(snapshotter, chain_id, key,
                                       labels={"containerd.io/snapshot.ref": chain_id})
            except BaseException as e:
                with contextlib.suppress(NotFound):
                    client.remove_snapshot(snapshotter, key)
                if not isinstance(e, AlreadyExists):
                    raise   # else another unpack committed it first: the same content
            else:
                applied += 1
        parent = chain_id
    if ids:  # keep the unpacked snapshots alive as long as the image's config is
        client.label_content(chain.config_digest,
                             {f"containerd.io/gc.ref.snapshot.{snapshotter}": ids[-1]})
    return applied
