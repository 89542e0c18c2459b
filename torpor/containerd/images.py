"""Images in containerd's content store: manifests, configs, chain IDs, unpacking into snapshots."""

from __future__ import annotations

import hashlib
import json
import platform as host_platform
from typing import Any

from torpor.containerd.api import types_pb2
from torpor.containerd.client import Client
from torpor.errors import ImageError, NotFound
from torpor.node.facts import go_arch

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
MAX_JSON_BLOB = 4 << 20


def read_json(client: Client, digest: str) -> dict[str, Any]:
    data = bytearray()
    for chunk in client.read_content(digest):
        data += chunk
        if len(data) > MAX_JSON_BLOB:
            raise ImageError(f"blob {digest} is larger than {MAX_JSON_BLOB} bytes: not a manifest")
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise ImageError(f"content {digest} in containerd does not match its digest")
    try:
        parsed: dict[str, Any] = json.loads(data)
    except ValueError:
        raise ImageError(f"blob {digest} is not JSON") from None
    return parsed


def platform_manifest(client: Client, target: types_pb2.Descriptor | dict[str, Any],
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest descriptor, manifest) for this node's platform under `target`."""
    desc: dict[str, Any] = target if isinstance(target, dict) else {
        "mediaType": target.media_type, "digest": target.digest, "size": target.size}
    doc = read_json(client, str(desc["digest"]))
    if desc["mediaType"] in INDEX_TYPES or doc.get("manifests"):
        arch, os_name = go_arch(), host_platform.system().lower()
        for child in doc.get("manifests", []):
            plat = child.get("platform") or {}
            if plat.get("architecture") == arch and plat.get("os") == os_name:
                return child, read_json(client, child["digest"])
        raise ImageError(f"image index {desc['digest']} has no manifest for {os_name}/{arch}")
    return desc, doc


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The snapshot names of an image's layers: chain(n) = sha256(chain(n-1) + ' ' + diff(n))."""
    chain: list[str] = []
    for diff_id in diff_ids:
        if not chain:
            chain.append(diff_id)
        else:
            chain.append("sha256:" + hashlib.sha256(f"{chain[-1]} {diff_id}".encode()).hexdigest())
    return chain


def image_chain(client: Client, image_name: str) -> dict[str, Any]:
    """Digests and chain ID of an image present in containerd."""
    image = client.get_image(image_name)
    manifest_desc, manifest = platform_manifest(client, image.target)
    config = read_json(client, manifest["config"]["digest"])
    diff_ids = list(config.get("rootfs", {}).get("diff_ids", []))
    chain = chain_ids(diff_ids)
    return {
        "name": image_name,
        "target": {"mediaType": image.target.media_type, "digest": image.target.digest,
                   "size": image.target.size},
        "manifest": manifest_desc,
        "config_digest": manifest["config"]["digest"],
        "layers": manifest.get("layers", []),
        "diff_ids": diff_ids,
        "chain_id": chain[-1] if chain else "",
    }


def ensure_unpacked(client: Client, snapshotter: str, chain: dict[str, Any]) -> int:
    """Unpack the image's layers into `snapshotter` where missing; returns layers applied."""
    applied = 0
    ids = chain_ids(chain["diff_ids"])
    parent = ""
    for layer, chain_id in zip(chain["layers"], ids, strict=True):
        if not client.has_snapshot(snapshotter, chain_id):
            key = f"torpor-unpack-{chain_id}"
            try:
                mounts = client.prepare_snapshot(snapshotter, key, parent)
            except Exception:
                client.remove_snapshot(snapshotter, key)
                mounts = client.prepare_snapshot(snapshotter, key, parent)
            try:
                client.apply_diff(types_pb2.Descriptor(
                    media_type=layer["mediaType"], digest=layer["digest"], size=layer["size"]),
                    mounts)
                client.commit_snapshot(snapshotter, chain_id, key,
                                       labels={"containerd.io/snapshot.ref": chain_id})
            except BaseException:
                try:
                    client.remove_snapshot(snapshotter, key)
                except NotFound:
                    pass
                raise
            applied += 1
        parent = chain_id
    if ids:  # keep the unpacked snapshots alive as long as the image's config is
        client.label_content(chain["config_digest"],
                             {f"containerd.io/gc.ref.snapshot.{snapshotter}": ids[-1]})
    return applied
