"""The checkpoint OCI image Kubernetes restores from: a kubelet checkpoint archive as a one-layer
image, the way `checkpointctl build` and containerd's own tests make it.

    manifest (OCI, annotations org.criu.checkpoint.container.name and friends)
      config   an OCI image config for the node's platform, rootfs = the one layer
      layer    the archive itself, tar+zstd: its root holds checkpoint/, config.dump, ...

containerd 2.1+ recognises it by the annotation on whatever the reference resolves to (here the
manifest: torpor pushes no index above it), unpacks it through the pod's snapshotter and reads
the archive's files from that view. The layer blob is a zstd-compressed kubelet archive, so
checkpointctl reads it directly.

With recipients the layer is encrypted in ocicrypt's format (`...tar+zstd+encrypted`,
torpor.image.ocicrypt): the node that restores it decrypts it as it unpacks it, through the
stream processor containerd's configuration names for that type (torpor-decoder or imgcrypt's
ctd-decoder, with the node's keys; docs/encryption.md). The config's diff_id and the manifest's
annotations stay in the clear, as in every ocicrypt image.
"""

from __future__ import annotations

import platform
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torpor.formats import annotations as ann
from torpor.formats import mediatypes as mt
from torpor.formats import timestamps
from torpor.formats.digests import sha256_digest
from torpor.formats.oci import Descriptor
from torpor.image import documents, ocicrypt
from torpor.image import layers as layer_io
from torpor.image.encryption_keys import Recipient
from torpor.image.kube_archive import KubeArchive
from torpor.node.facts import go_arch
from torpor.registry.layout import Layout


@dataclass(frozen=True)
class BuiltKubeImage:
    layout: Path
    manifest: Descriptor
    layer: Descriptor
    archive_bytes: int


def annotations_of(archive: KubeArchive) -> dict[str, str]:
    """checkpointctl's image annotations, from the archive's records."""
    spec_annotations = archive.spec.get("annotations") or {}
    found = {
        ann.CHECKPOINT_IMAGE_CONTAINER: archive.container_name,
        ann.CHECKPOINT_IMAGE_ENGINE: "containerd",
        ann.CHECKPOINT_IMAGE_POD: str(spec_annotations.get(ann.CRI_SANDBOX_NAME) or ""),
        ann.CHECKPOINT_IMAGE_NAMESPACE: str(spec_annotations.get(ann.CRI_SANDBOX_NAMESPACE)
                                            or ""),
        ann.CHECKPOINT_IMAGE_ROOTFS: archive.config.rootfs_image_name,
        ann.CHECKPOINT_IMAGE_RUNTIME: archive.config.runtime,
    }
    return {k: v for k, v in found.items() if v}


def build(archive: KubeArchive, layout_dir: str, ref_name: str | None,
          level: int = 3, recipients: Sequence[Recipient] = ()) -> BuiltKubeImage:
    """The image into the OCI layout `layout_dir` (created if new), tagged `ref_name`, its layer
    encrypted for `recipients` if there are any."""
    layout = Layout(Path(layout_dir))
    created = layout.create()
    staging = Path(layout_dir) / ".torpor-build"
    staging.mkdir(mode=0o700, exist_ok=True)
    try:
        written = layer_io.compress_file(archive.path, str(staging / "archive.tar.zst"), level)
        layer = Descriptor(mt.OCI_LAYER_ZSTD, written.digest, written.size)
        path = written.path
        if recipients:
            path = str(staging / "archive.tar.zst.encrypted")
            sealed = ocicrypt.encrypt_blob(written.path, path, mt.OCI_LAYER_ZSTD, recipients,
                                           durable=False)
            raw = {"mediaType": sealed.media_type, "digest": sealed.digest, "size": sealed.size,
                   "annotations": sealed.annotations}
            layer = Descriptor(sealed.media_type, sealed.digest, sealed.size, raw)
        layout.blob_dir(layer.digest)
        shutil.move(path, layout.blob_path(layer.digest))
        now = timestamps.now()
        config: dict[str, Any] = {
            "created": now, "architecture": go_arch(), "os": platform.system().lower(),
            "config": {}, "rootfs": {"type": "layers", "diff_ids": [written.diff_id]},
            "history": [{"created": now, "created_by": "torpor kube image",
                         "comment": f"kubelet checkpoint of {archive.container_name}"}]}
        config_desc = _blob(layout, config, mt.OCI_CONFIG)
        annotations = {**annotations_of(archive), ann.CREATED: now}
        manifest = {"schemaVersion": 2, "mediaType": mt.OCI_MANIFEST,
                    "config": config_desc.to_json(), "layers": [layer.to_json()],
                    "annotations": annotations}
        manifest_desc = _blob(layout, manifest, mt.OCI_MANIFEST)
        layout.tag(manifest_desc, ref_name)
    except BaseException:
        if created:
            shutil.rmtree(layout_dir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return BuiltKubeImage(Path(layout_dir), manifest_desc, layer, written.raw_size)


def _blob(layout: Layout, document: dict[str, Any], media_type: str) -> Descriptor:
    data = documents.canonical(document)
    digest = sha256_digest(data)
    layout.write_small(digest, data, durable=True)
    return Descriptor(media_type, digest, len(data))
