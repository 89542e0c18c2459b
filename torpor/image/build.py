"""A checkpoint directory as an OCI image: one index, two manifests (docs/format.md).

    index (application/vnd.oci.image.index.v1+json)
    ├── runnable image manifest, platform linux/<arch>
    │     config  the base image's config + the read-write layer's diff ID
    │     layers  the base image's layers (same digests) + the read-write layer (tar+zstd)
    └── state manifest, platform unknown/unknown, artifactType application/vnd.torpor.checkpoint.v1
          config  checkpoint.json (container, spec, image, options, node, state, sizes, timings)
          layers  CRIU images in parts, volumes, torpor's state (each tar+zstd)

Every layer is compressed once, in parallel, with its digest and size computed in the same
pass; the base image's layers are copied from containerd's content store, digest-checked.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torpor.containerd import images as containerd_image
from torpor.containerd.client import Client
from torpor.errors import ImageError
from torpor.formats import annotations as ann
from torpor.formats import mediatypes as mt
from torpor.formats import names
from torpor.formats.digests import new_hasher, sha256_digest, verify_hasher
from torpor.formats.oci import Descriptor
from torpor.image import directory as checkpoint_dir
from torpor.image import documents
from torpor.image import layers as layer_io
from torpor.registry.layout import Layout

PIECE = 64 << 20          # a big file is split into pieces of this size
MIN_PART = 64 << 20       # and pieces are grouped into parts of at least this size
Progress = Callable[[int], None]


@dataclass
class BuiltImage:
    layout: Path
    index: Descriptor
    runnable: Descriptor
    state: Descriptor
    raw_bytes: int         # the checkpoint's files, uncompressed
    compressed_bytes: int  # the new layers (base layers not counted)
    seconds: float


def _json_blob(layout: Layout, document: dict[str, Any], media_type: str,
               extra: dict[str, Any] | None = None) -> Descriptor:
    data = documents.canonical(document)
    digest = sha256_digest(data)
    layout.write_small(digest, data, durable=False)
    return Descriptor(media_type, digest, len(data), {**(extra or {}), "mediaType": media_type,
                                                      "digest": digest, "size": len(data)})


def _move_in(layout: Layout, written: layer_io.WrittenLayer) -> Path:
    """Move a finished layer from staging to its blob path (once; later calls find it there)."""
    path = layout.blob_path(written.digest)
    if written.path != str(path):
        layout.blob_dir(written.digest)
        os.replace(written.path, path)
        written.path = str(path)
    return path


def _adopt(layout: Layout, written: layer_io.WrittenLayer, media_type: str,
           annotations: dict[str, str]) -> Descriptor:
    _move_in(layout, written)
    raw: dict[str, Any] = {"mediaType": media_type, "digest": written.digest, "size": written.size}
    if annotations:
        raw["annotations"] = annotations
    return Descriptor(media_type, written.digest, written.size, raw)


def _copy_from_containerd(client: Client, layout: Layout, desc: dict[str, Any]) -> None:
    digest, size = desc["digest"], int(desc["size"])
    path = layout.blob_path(digest)
    if layout.holds_intact(Descriptor(desc["mediaType"], digest, size)):
        return
    layout.blob_dir(digest)
    partial = path.with_name(path.name + ".partial")
    hasher = new_hasher(digest)
    written = 0
    with open(partial, "wb") as out:
        for chunk in client.read_content(digest):
            out.write(chunk)
            hasher.update(chunk)
            written += len(chunk)
    try:
        if written != size:
            raise ImageError(f"containerd's copy of base layer {digest} has {written} bytes, "
                             f"not {size}")
        verify_hasher(hasher, digest, f"containerd's copy of base layer {digest}")
    except ImageError:
        partial.unlink(missing_ok=True)
        raise
    os.chmod(partial, 0o600)
    os.replace(partial, path)


BlobSink = Callable[[Path, Descriptor], None]


def build(client: Client, directory: str, layout_dir: str, *, ref_name: str | None = None,
          level: int = 1, workers: int = 0, progress: Progress | None = None,
          on_blob: BlobSink | None = None) -> BuiltImage:
    """Build the image into `layout_dir`; `on_blob(path, descriptor)` hears of each new layer
    as soon as it is written (from a worker thread), to upload it early."""
    started = time.monotonic()
    moving = threading.Lock()

    def early(layer: layer_io.WrittenLayer, media_type: str) -> None:
        with moving:
            path = _move_in(layout, layer)
        if on_blob is not None:
            on_blob(path, Descriptor(media_type, layer.digest, layer.size))

    metadata = checkpoint_dir.load(directory)
    base = metadata.image
    if base is None:
        raise ImageError("the checkpoint records no base image; it cannot be made runnable")
    layout = Layout(Path(layout_dir))
    created = layout.create()
    staging = Path(layout_dir) / ".torpor-build"
    staging.mkdir(mode=0o700, exist_ok=True)
    try:
        files = [f.path for f in metadata.files]
        raw_bytes = sum(f.size for f in metadata.files)
        criu_dir, ours = f"{names.CRIU_DIR}/", f"{names.CRIU_DIR}/{names.STATE_PREFIX}"
        criu = [p for p in files if p.startswith(criu_dir) and not p.startswith(ours)]
        volumes = [p for p in files if p.startswith((f"{criu_dir}{names.VOLUME_ARCHIVE_PREFIX}",
                                                     f"{criu_dir}{names.DEV_SHM_ARCHIVE}"))]
        state = [p for p in files if p.startswith(ours) and p not in volumes]
        state += [p for p in files if p == names.CRIU_DUMP_LOG]
        criu_pieces = layer_io.pieces_of(directory, criu, PIECE)
        cpus = os.cpu_count() or 1
        target = max(MIN_PART, sum(p.length for p in criu_pieces) // (2 * cpus) + 1)
        jobs: list[tuple[str, list[layer_io.Piece]]] = [
            (mt.CRIU_LAYER, g) for g in layer_io.group(criu_pieces, target)]
        jobs += [(mt.VOLUMES_LAYER, g) for g in
                 layer_io.group(layer_io.pieces_of(directory, volumes, PIECE), target)]
        jobs.append((mt.STATE_LAYER, layer_io.pieces_of(directory, state, PIECE)))
        kinds = {id(g): kind for kind, g in jobs}
        written = layer_io.write_layers(
            [g for _, g in jobs], str(staging), level, workers, progress,
            on_done=lambda layer: early(layer, kinds[id(layer.pieces)]))
        parts = sum(1 for kind, _ in jobs if kind == mt.CRIU_LAYER)
        state_layers = []
        for i, ((kind, _), layer) in enumerate(zip(jobs, written, strict=True)):
            annotations = {ann.PART: f"{i + 1}/{parts}"} if kind == mt.CRIU_LAYER else {}
            state_layers.append(_adopt(layout, layer, kind, annotations))

        diff = os.path.join(directory, names.ROOTFS_DIFF)
        diff_layer = (layer_io.compress_file(diff, str(staging / "rootfs.tar.zst"), level,
                                             progress) if os.path.exists(diff) else None)
        if diff_layer is not None:
            early(diff_layer, mt.OCI_LAYER_ZSTD)

        container_id = metadata.container.id
        config_desc = _json_blob(layout, metadata.to_json(), mt.CHECKPOINT_CONFIG)
        created_at = metadata.created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        state_desc = _json_blob(layout, documents.state_manifest(
            config_desc, state_layers, created_at, container_id), mt.OCI_MANIFEST,
            documents.state_entry())

        base_manifest = containerd_image.read_json(client, base.manifest.digest)
        base_config = containerd_image.read_json(client, base.config_digest)
        for layer in base_manifest.get("layers", []):
            _copy_from_containerd(client, layout, layer)
        run_layers = list(base_manifest.get("layers", []))
        if diff_layer is not None:
            run_layers.append(_adopt(layout, diff_layer, mt.OCI_LAYER_ZSTD, {}).to_json())
        run_config = documents.runnable_config(
            base_config, diff_layer.diff_id if diff_layer else None, created_at, container_id)
        run_config_desc = _json_blob(layout, run_config, mt.OCI_CONFIG)
        runnable_desc = _json_blob(layout, documents.runnable_manifest(
            run_config_desc, run_layers, created_at, base.name, base.manifest.digest,
            container_id), mt.OCI_MANIFEST, documents.runnable_entry(run_config))
        index = documents.index(runnable_desc, state_desc, created_at, container_id, base.name)
        index_desc = _json_blob(layout, index, mt.OCI_INDEX)
        layout.tag(index_desc, ref_name)
    except BaseException:
        if created:
            shutil.rmtree(layout_dir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    compressed = sum(d.size for d in state_layers) + (diff_layer.size if diff_layer else 0)
    return BuiltImage(Path(layout_dir), index_desc, runnable_desc, state_desc, raw_bytes,
                      compressed, time.monotonic() - started)

