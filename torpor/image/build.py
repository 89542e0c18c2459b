"""A checkpoint directory as an OCI image: one index, two manifests (docs/format.md).

    index (application/vnd.oci.image.index.v1+json)
    ├── runnable image manifest, platform linux/<arch>
    │     config  the base image's config + the read-write layer's diff ID
    │     layers  the base image's layers (same digests) + the read-write layer (tar+zstd)
    └── state manifest, platform unknown/unknown, artifactType application/vnd.torpor.checkpoint.v1
          config  checkpoint.json (container, spec, image, options, node, state, sizes, timings)
          layers  the chunk index of CRIU's images, the packs it needs (chunks.py, packs.py),
                  volumes, torpor's state (tar+zstd)

CRIU's images are cut into content-defined chunks; only chunks the previous generation does not
hold are compressed and written, in new packs, and the packs of the previous generation that
still hold needed chunks are linked in, so that the layout is complete on its own. Every other
layer is deterministic (layers.py): the same files give the same digest. Layers are compressed
in parallel, with digest and size computed in the same pass; the base image's layers are copied
from containerd's content store, digest-checked.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import zstandard

from torpor.containerd import images as containerd_image
from torpor.containerd.client import Client
from torpor.errors import ImageError
from torpor.formats import annotations as ann
from torpor.formats import mediatypes as mt
from torpor.formats import names, timestamps
from torpor.formats.chunk_index import ChunkIndex, PackRecord
from torpor.formats.digests import new_hasher, sha256_digest, verify_hasher
from torpor.formats.metadata import CheckpointMetadata
from torpor.formats.oci import Descriptor, OciDocument, distinct_blobs, stored_bytes
from torpor.image import directory as checkpoint_dir
from torpor.image import documents, kube_archive, rw_merge
from torpor.image import layers as layer_io
from torpor.image.early_packs import EarlyPacks
from torpor.image.follow import Followed
from torpor.image.generations import Previous, link_or_copy, params_of
from torpor.image.packs import GenerationStats, WrittenGeneration, write_generation
from torpor.registry.layout import Layout

PIECE = 64 << 20          # a big volume archive is split into pieces of this size
PART = 128 << 20          # and pieces are grouped into layers of about this size (fixed, so
                          # that the same files give the same layers on any node)
INDEX_LEVEL = 3           # the chunk index compresses to about half (its digests do not)
Progress = Callable[[int], None]


@dataclass
class BuiltImage:
    layout: Path
    index: Descriptor
    runnable: Descriptor
    state: Descriptor
    raw_bytes: int         # the checkpoint's files, uncompressed
    compressed_bytes: int  # its own blobs: configs, state layers, read-write layer (not the base's)
    seconds: float
    new_bytes: int = 0     # blobs the previous generation did not have (what a push sends)
    chunks: GenerationStats | None = None
    previous: str | None = None   # the local image it built on
    chunk_index: str = ""         # the digest of its chunk index blob (written here: sound)


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
    _fetch(client, digest, size, path)


def _fetch(client: Client, digest: str, size: int, path: Path) -> None:
    """A blob of containerd's content store into `path`, digest-checked."""
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


BlobSink = Callable[[Path, Descriptor, bool], None]   # path, descriptor, written_here


def _merged_rw_layer(client: Client, previous: Previous | None, older: dict[str, Any],
                     newer: str, staging: Path) -> str:
    """The older read-write layer (the last of the image the container was restored from) and
    this checkpoint's, as one uncompressed tar in `staging` (rw_merge.py says why)."""
    digest, size = str(older["digest"]), int(older["size"])
    held = previous.held.get(digest) if previous else None
    blob = staging / "older-rw.blob"
    if held is not None and held.stat().st_size == size:
        link_or_copy(held, blob)
    else:
        _fetch(client, digest, size, blob)
    older_tar, merged = staging / "older-rw.tar", staging / "rootfs-merged.tar"
    kube_archive.decompress_layer(str(blob), str(older_tar))  # gzip, zstd or plain
    blob.unlink()
    with open(older_tar, "rb") as a, open(newer, "rb") as b, open(merged, "wb") as out:
        rw_merge.merge(a, b, out)
    older_tar.unlink()
    return str(merged)


def _on_base(metadata: CheckpointMetadata, layers: list[dict[str, Any]], config: OciDocument,
             merged: str) -> CheckpointMetadata:
    """The metadata an image with a merged read-write layer carries: its base layers are those
    under that layer (what restore checks the runnable layers against), and the read-write
    layer's size the merged one's (what its extraction is held to). The image it names stays
    the one the container ran on (kubelet's archive names it to be pulled again: the merged
    layer applies over it alike, since it already holds the older layer's changes)."""
    assert metadata.image is not None
    diff_ids = tuple(str(d) for d in config["rootfs"]["diff_ids"])
    image = replace(metadata.image,
                    layers=tuple(Descriptor.from_json(layer, f"base layer {i}")
                                 for i, layer in enumerate(layers)),
                    diff_ids=diff_ids,
                    chain_id=containerd_image.chain_ids(list(diff_ids))[-1] if diff_ids else "")
    size = os.path.getsize(merged)
    files = tuple(replace(f, size=size) if f.path == names.ROOTFS_DIFF else f
                  for f in metadata.files)
    return replace(metadata, image=image, files=files)


def compress_index(index: ChunkIndex) -> bytes:
    """The chunk index blob: its deterministic JSON as one zstd frame (content size written)."""
    compressor = zstandard.ZstdCompressor(level=INDEX_LEVEL, write_checksum=False,
                                          write_content_size=True, write_dict_id=False, threads=0)
    return compressor.compress(index.to_json())


def _place_packs(layout: Layout, generation: WrittenGeneration, staging: Path,
                 previous: Previous | None) -> list[Descriptor]:
    """Every pack of the generation into the layout, in index order: new ones moved from
    staging, old ones linked from the previous generation's."""
    new = {p.digest for p in generation.new_packs}
    out = []
    for pack in generation.index.packs:
        path = layout.blob_path(pack.digest)
        if pack.digest in new:
            _place_pack(layout, staging, pack)  # (placed already when it was uploaded early)
        elif not path.exists():
            if previous is None or pack.digest not in previous.packs:
                raise ImageError(f"pack {pack.digest} of the previous generation is gone")
            layout.blob_dir(pack.digest)
            link_or_copy(previous.packs[pack.digest], path)
        out.append(_pack_layer(pack))
    return out


def _place_pack(layout: Layout, staging: Path, pack: PackRecord) -> None:
    """A new pack from staging into the layout, unless it is there already."""
    staged = staging / pack.digest.split(":", 1)[1]
    if staged.exists():
        layout.blob_dir(pack.digest)
        os.replace(staged, layout.blob_path(pack.digest))


def early_sender(pack_dir: str, on_blob: BlobSink) -> Callable[[PackRecord], None]:
    """For an EarlyPacker packing into `pack_dir` before build() runs: each whole pack to
    `on_blob` through a link of its own (<pack_dir>/sent/), so that build() can move the pack
    into the layout while it still goes up."""
    sent = os.path.join(pack_dir, "sent")

    def send(pack: PackRecord) -> None:
        name = pack.digest.split(":", 1)[1]
        os.makedirs(sent, mode=0o700, exist_ok=True)
        link = os.path.join(sent, name)
        if not os.path.exists(link):
            os.link(os.path.join(pack_dir, name), link)
        on_blob(Path(link), _pack_layer(pack), True)
    return send


def _pack_layer(pack: PackRecord) -> Descriptor:
    return Descriptor(mt.PACK, pack.digest, pack.size,
                      {"mediaType": mt.PACK, "digest": pack.digest, "size": pack.size})


def build(client: Client, directory: str, layout_dir: str, *, ref_name: str | None = None,
          level: int = 1, workers: int = 0, progress: Progress | None = None,
          on_blob: BlobSink | None = None, previous: Previous | None = None,
          annotations: dict[str, str] | None = None,
          followed: Followed | None = None, packed: EarlyPacks | None = None) -> BuiltImage:
    """Build the image into `layout_dir`; `on_blob(path, descriptor, written_here)` hears of
    each layer as soon as it is written (from a worker thread), to upload it early;
    `written_here` says its digest was computed here from the bytes written (false for the
    previous generation's packs this one uses). CRIU's images are stored as chunks, only those
    the `previous` generation does not hold being written again; `annotations` go on the state
    manifest; `followed`: CRIU's pages images as a DumpFollower cut them during the dump;
    `packed`: what an EarlyPacker packed of them meanwhile (its packs sent by `early_sender`;
    the open packs it did not take are the caller's to abandon)."""
    started = time.monotonic()
    moving = threading.Lock()

    def early(layer: layer_io.WrittenLayer, media_type: str) -> None:
        with moving:
            path = _move_in(layout, layer)
        if on_blob is not None:
            on_blob(path, Descriptor(media_type, layer.digest, layer.size), True)

    metadata = checkpoint_dir.load(directory)
    base = metadata.image
    if base is None:
        raise ImageError("the checkpoint records no base image; it cannot be made runnable")
    layout = Layout(Path(layout_dir))
    created = layout.create()
    staging = Path(layout_dir) / ".torpor-build"
    staging.mkdir(mode=0o700, exist_ok=True)
    try:
        files = sorted(f.path for f in metadata.files)
        raw_bytes = sum(f.size for f in metadata.files)
        criu_dir, ours = f"{names.CRIU_DIR}/", f"{names.CRIU_DIR}/{names.STATE_PREFIX}"
        criu = [p for p in files if p.startswith(criu_dir) and not p.startswith(ours)]
        volumes = [p for p in files if p.startswith((f"{criu_dir}{names.VOLUME_ARCHIVE_PREFIX}",
                                                     f"{criu_dir}{names.DEV_SHM_ARCHIVE}"))]
        state = [p for p in files if p.startswith(ours) and p not in volumes]
        state += [p for p in files if p == names.CRIU_DUMP_LOG]

        # CRIU's images: chunks in packs, then the chunk index
        pack_staging = Path(packed.pack_dir) if packed is not None else staging / "packs"
        pack_staging.mkdir(mode=0o700, exist_ok=packed is not None)
        sent: set[str] = set()

        def pack_done(pack: PackRecord) -> None:  # into the layout and up, while more are cut
            assert on_blob is not None
            with moving:
                _place_pack(layout, pack_staging, pack)
            sent.add(pack.digest)
            on_blob(layout.blob_path(pack.digest), _pack_layer(pack), True)

        generation = write_generation(
            directory, criu, str(pack_staging), known=previous.known if previous else None,
            params=params_of(previous.chunks if previous else None), workers=workers,
            on_pack=pack_done if on_blob is not None else None,
            followed=followed.under(criu_dir) if followed is not None else None,
            early=packed.under(criu_dir) if packed is not None else None)
        if progress:
            progress(generation.stats.total_bytes)
        pack_layers = _place_packs(layout, generation, pack_staging, previous)
        if on_blob is not None:  # the previous generation's packs this one still uses
            for pack_layer in pack_layers:
                if pack_layer.digest not in sent:
                    on_blob(layout.blob_path(pack_layer.digest), pack_layer, False)
        index_blob = compress_index(generation.index)
        index_layer = Descriptor(mt.CHUNK_INDEX_ZSTD, sha256_digest(index_blob), len(index_blob))
        layout.write_small(index_layer.digest, index_blob, durable=False)
        index_layer = Descriptor(index_layer.media_type, index_layer.digest, index_layer.size,
                                 index_layer.to_json())
        if on_blob is not None:
            on_blob(layout.blob_path(index_layer.digest), index_layer, True)

        # volumes and torpor's state: deterministic tar+zstd layers
        jobs: list[tuple[str, list[layer_io.Piece]]] = [
            (mt.VOLUMES_LAYER, g) for g in
            layer_io.group(layer_io.pieces_of(directory, volumes, PIECE), PART)]
        jobs.append((mt.STATE_LAYER, layer_io.pieces_of(directory, state, PIECE)))
        kinds = {id(g): kind for kind, g in jobs}
        written = layer_io.write_layers(
            [g for _, g in jobs], str(staging), level, workers, progress,
            on_done=lambda layer: early(layer, kinds[id(layer.pieces)]))
        state_layers = [index_layer, *pack_layers]
        for (kind, _), layer in zip(jobs, written, strict=True):
            state_layers.append(_adopt(layout, layer, kind, {}))

        # the read-write layer: one layer over the base image's, however many generations
        base_manifest = containerd_image.read_json(client, base.manifest.digest)
        base_config = containerd_image.read_json(client, base.config_digest)
        base_layers = list(base_manifest.get("layers", []))
        base_name, base_digest = base.name, base.manifest.digest
        rootfs_diff = os.path.join(directory, names.ROOTFS_DIFF)
        diff = rootfs_diff if os.path.exists(rootfs_diff) else None
        if diff is not None and documents.ends_with_rw_layer(base_manifest, base_config):
            diff = _merged_rw_layer(client, previous, base_layers.pop(), diff, staging)
            base_config = documents.without_rw_layer(base_config)
            notes = base_manifest.get("annotations") or {}
            base_name = str(notes.get(ann.BASE_NAME, base_name))
            base_digest = str(notes.get(ann.BASE_DIGEST, base_digest))
            metadata = _on_base(metadata, base_layers, base_config, diff)
        diff_layer = (layer_io.compress_file(diff, str(staging / "rootfs.tar.zst"), level,
                                             progress) if diff is not None else None)
        if diff_layer is not None:
            early(diff_layer, mt.OCI_LAYER_ZSTD)

        container_id = metadata.container.id
        config_desc = _json_blob(layout, metadata.to_json(), mt.CHECKPOINT_CONFIG)
        created_at = metadata.created or timestamps.now()
        for layer in base_layers:  # from the previous generation, if it has them
            reused = previous.held.get(str(layer.get("digest"))) if previous else None
            if reused is not None and reused.stat().st_size == layer.get("size"):
                target = layout.blob_path(str(layer["digest"]))
                layout.blob_dir(str(layer["digest"]))
                if not target.exists():
                    link_or_copy(reused, target)
                continue
            _copy_from_containerd(client, layout, layer)
        run_layers = list(base_layers)
        if diff_layer is not None:
            run_layers.append(_adopt(layout, diff_layer, mt.OCI_LAYER_ZSTD, {}).to_json())
        run_config = documents.runnable_config(
            base_config, diff_layer.diff_id if diff_layer else None, created_at, container_id)
        run_config_desc = _json_blob(layout, run_config, mt.OCI_CONFIG)

        # what this generation adds to the previous one
        base_digests = {str(layer.get("digest")) for layer in base_layers}
        ours_now = [*state_layers, config_desc, run_config_desc]
        if diff_layer is not None:
            ours_now.append(Descriptor(mt.OCI_LAYER_ZSTD, diff_layer.digest, diff_layer.size))
        held = previous.blobs if previous else frozenset()
        own = distinct_blobs(ours_now, excluding=base_digests)
        own_bytes = stored_bytes(own)
        new_bytes = sum(d.size for d in own if d.digest not in held)
        generation_notes = {ann.NEW_BYTES: str(new_bytes),
                            ann.CHUNKS_NEW_BYTES: str(generation.stats.new_pack_bytes)}
        if previous is not None:
            generation_notes[ann.PREVIOUS] = previous.index_digest
        state_desc = _json_blob(layout, documents.state_manifest(
            config_desc, state_layers, created_at, container_id,
            {**generation_notes, **(annotations or {})}), mt.OCI_MANIFEST,
            documents.state_entry())
        runnable_desc = _json_blob(layout, documents.runnable_manifest(
            run_config_desc, run_layers, created_at, base_name, base_digest,
            container_id), mt.OCI_MANIFEST, documents.runnable_entry(run_config))
        index = documents.index(runnable_desc, state_desc, created_at, container_id, base_name)
        index_desc = _json_blob(layout, index, mt.OCI_INDEX)
        layout.tag(index_desc, ref_name)
    except BaseException:
        if created:
            shutil.rmtree(layout_dir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return BuiltImage(Path(layout_dir), index_desc, runnable_desc, state_desc, raw_bytes,
                      own_bytes, time.monotonic() - started, new_bytes, generation.stats,
                      previous.ref if previous else None, index_layer.digest)
