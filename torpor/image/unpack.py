"""Reading a checkpoint image back: find its two manifests, check it, unpack the state layers
into a checkpoint directory, and put the runnable image into containerd.

Nothing is trusted before it is checked: manifests and the metadata are digest-checked (by the
layout or the registry client) within size limits, the layer count and what the metadata says
the layers unpack to are checked against the limits (`[restore]`) before any layer is read,
every layer's digest is checked as it is extracted, every extracted file must be one the
metadata lists and no bigger, and layers of media types this torpor does not know are refused
before anything is written.

An encrypted checkpoint (docs/encryption.md) has layers of the plain types + `+encrypted` and,
first in its state manifest, a metadata layer: the whole metadata, while the config keeps only
what a preflight needs (torpor.image.clear_metadata). Encrypted layers are decrypted into private
scratch space beside the target, each checked (HMAC, sealed digest) before it is used.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import zstandard

from torpor.archive import safe_name
from torpor.config import Config
from torpor.containerd import images as containerd_image
from torpor.containerd.api import images_pb2, types_pb2
from torpor.containerd.client import Client
from torpor.errors import (
    AlreadyExists,
    DigestMismatch,
    FormatError,
    ImageError,
    RestoreError,
    UnsafeArchive,
)
from torpor.formats import annotations as ann
from torpor.formats import mediatypes as mt
from torpor.formats import names
from torpor.formats.chunk_index import MAX_INDEX_BYTES, ChunkIndex
from torpor.formats.digests import sha256_digest
from torpor.formats.metadata import BaseImage, CheckpointMetadata
from torpor.formats.oci import Descriptor, OciDocument, distinct_blobs
from torpor.image import clear_metadata, extract, ocicrypt, reassemble
from torpor.image import directory as checkpoint_dir
from torpor.image.encryption_annotations import open_layer_key
from torpor.image.encryption_keys import DecryptionKey
from torpor.registry.arrivals import Arrivals
from torpor.registry.layout import Layout


class LazyRebuild(Protocol):
    """What rebuilds CRIU's images for a lazy restore from its own chunk source (torpor.lazy)."""

    def rebuild(self, index: ChunkIndex, target: str) -> None: ...

RATIO_FLOOR = 64 << 20   # below this many bytes unpacked, the compression ratio is not checked
# A chunk index's JSON per byte of its zstd blob: about 2 for real ones (their sha256 digests do
# not compress); one of a memory full of a single repeated page compresses better, but stays
# small. Below INDEX_FLOOR bytes the ratio is not checked.
INDEX_RATIO = 32
INDEX_FLOOR = 1 << 20
INDEX_HINT = ("the checkpoint's chunk index is damaged or hostile; `[restore] "
              "max_chunk_index_bytes` caps what a genuine one may unpack to")


@dataclass(frozen=True)
class ImageLimits:
    """How big a checkpoint image may be (`[restore]` in the config)."""

    max_layers: int = 4096
    max_manifest_bytes: int = 4 << 20
    max_config_bytes: int = 16 << 20
    max_unpacked_bytes: int = 1 << 40
    max_ratio: int = 10000
    max_files: int = 1_000_000
    max_chunk_index_bytes: int = MAX_INDEX_BYTES

    @classmethod
    def of(cls, cfg: Config) -> ImageLimits:
        return cls(cfg.restore_max_layers, cfg.restore_max_manifest_bytes,
                   cfg.restore_max_config_bytes, cfg.restore_max_unpacked_bytes,
                   cfg.restore_max_compression_ratio, cfg.restore_max_files,
                   cfg.restore_max_chunk_index_bytes)


MANIFEST_LIMIT = ImageLimits().max_manifest_bytes
CONFIG_LIMIT = ImageLimits().max_config_bytes


@dataclass
class CheckpointImage:
    index: Descriptor
    runnable: Descriptor
    runnable_manifest: dict[str, Any]
    state: Descriptor
    state_manifest: dict[str, Any]
    metadata: CheckpointMetadata          # the config: all of it, or its clear part (encrypted)

    @property
    def state_layers(self) -> list[Descriptor]:
        return [Descriptor.from_json(layer, f"state manifest layer {i}")
                for i, layer in enumerate(self.state_manifest.get("layers", []))]

    @property
    def payload_layers(self) -> list[Descriptor]:
        """The state layers that are tar+zstd archives (all but the metadata layer)."""
        return [d for d in self.state_layers if plain_type(d.media_type) != mt.METADATA_LAYER]

    @property
    def metadata_layer(self) -> Descriptor | None:
        return next((d for d in self.state_layers
                     if plain_type(d.media_type) == mt.METADATA_LAYER), None)

    @property
    def runnable_blobs(self) -> list[Descriptor]:
        doc = self.runnable_manifest
        return [Descriptor.from_json(doc["config"], "runnable config"),
                *(Descriptor.from_json(layer, f"runnable layer {i}")
                  for i, layer in enumerate(doc.get("layers", [])))]

    @property
    def own_layers(self) -> list[Descriptor]:
        """The runnable image's layers that are not the base image's (the read-write layer)."""
        base = len(self.metadata.image.layers) if self.metadata.image else 0
        return self.runnable_blobs[1 + base:]

    @property
    def own_blobs(self) -> list[Descriptor]:
        """The blobs this checkpoint adds to its base image: the state manifest's config and
        layers, the runnable config and the read-write layer (what "stores" counts,
        docs/generations.md)."""
        config = Descriptor.from_json(self.state_manifest["config"], "state config")
        runnable = self.runnable_blobs
        return distinct_blobs((config, *self.state_layers, runnable[0], *self.own_layers))

    @property
    def encrypted(self) -> bool:
        return any(ocicrypt.is_encrypted(d.media_type)
                   for d in (*self.state_layers, *self.runnable_blobs))

    @property
    def sealed(self) -> bool:
        """Its own layers are encrypted (a checkpoint encrypted as torpor encrypts one); not
        merely a base image whose layers were encrypted already."""
        return self.metadata_layer is not None or any(
            ocicrypt.is_encrypted(d.media_type) for d in (*self.state_layers, *self.own_layers))


def plain_type(media_type: str) -> str:
    return media_type.removesuffix(mt.ENCRYPTED_SUFFIX)


def _parse(body: bytes, what: str) -> OciDocument:
    try:
        document = json.loads(body)
    except ValueError:
        raise ImageError(f"{what} is not JSON") from None
    if not isinstance(document, dict):
        raise ImageError(f"{what} is not a JSON object")
    return document


def _layer_list(document: OciDocument, what: str) -> list[Any]:
    layers = document.get("layers", [])
    if not isinstance(layers, list):
        raise ImageError(f"{what}: 'layers' is not a list")
    return layers


def assemble(index_desc: Descriptor, index: OciDocument,
             manifests: dict[str, tuple[Descriptor, dict[str, Any]]],
             config: bytes, limits: ImageLimits = ImageLimits()) -> CheckpointImage:
    """The checkpoint image from its documents, checked for the shape docs/format.md gives and
    against `limits` before any layer is read."""
    runnable = state = None
    entries = index.get("manifests", [])
    if not isinstance(entries, list) or len(entries) > limits.max_layers:
        raise ImageError(f"index {index_desc.digest} has no list of manifests, or too many")
    for entry in entries:
        desc = Descriptor.from_json(entry, "index entry")
        role = desc.annotations.get(ann.ROLE)
        if desc.artifact_type == mt.ARTIFACT_TYPE or role == "state":
            state = desc
        elif role == "runnable" or (desc.platform or {}).get("os") == "linux":
            runnable = desc
    if state is None or runnable is None or state.digest not in manifests \
            or runnable.digest not in manifests:
        raise ImageError(f"{index_desc.digest} is not a torpor checkpoint image: its index lacks "
                         "a runnable manifest or a state manifest "
                         f"(artifactType {mt.ARTIFACT_TYPE})")
    state_doc = manifests[state.digest][1]
    runnable_doc = manifests[runnable.digest][1]
    state_layers = _layer_list(state_doc, f"state manifest {state.digest}")
    runnable_layers = _layer_list(runnable_doc, f"runnable manifest {runnable.digest}")
    if len(state_layers) + len(runnable_layers) > limits.max_layers:
        raise ImageError(f"the checkpoint image has {len(state_layers) + len(runnable_layers)} "
                         f"layers, more than the limit of {limits.max_layers}",
                         hint="a damaged or hostile image; or raise [restore] max_layers")
    if (state_doc.get("config") or {}).get("mediaType") != mt.CHECKPOINT_CONFIG:
        raise ImageError(f"state manifest {state.digest} has config type "
                         f"{(state_doc.get('config') or {}).get('mediaType')!r}, not "
                         f"{mt.CHECKPOINT_CONFIG}")
    for layer in state_layers:
        kind = layer.get("mediaType") if isinstance(layer, dict) else None
        if plain_type(str(kind)) not in (*mt.STATE_LAYER_TYPES, mt.METADATA_LAYER):
            raise ImageError(f"state manifest {state.digest} has a layer of unknown media type "
                             f"{kind!r}: this torpor cannot restore it",
                             hint="a newer torpor may know it")
    for layer in runnable_layers:
        kind = layer.get("mediaType") if isinstance(layer, dict) else None
        if plain_type(str(kind)) not in mt.OCI_LAYER_TYPES:
            raise ImageError(f"runnable manifest {runnable.digest} has a layer of unknown media "
                             f"type {kind!r}")
    try:
        metadata = CheckpointMetadata.loads(config, "checkpoint metadata")
    except FormatError as e:
        raise ImageError(str(e), hint=e.hint) from None
    image = CheckpointImage(index_desc, runnable, runnable_doc, state, state_doc, metadata)
    check_declared(image, limits)
    return image


def check_declared(image: CheckpointImage, limits: ImageLimits) -> None:
    """What the metadata says the layers unpack to, against the limits, before any is read."""
    metadata = image.metadata
    if len(metadata.files) > limits.max_files:
        raise ImageError(f"the checkpoint lists {len(metadata.files)} files, more than the limit "
                         f"of {limits.max_files} ([restore] max_files)")
    for entry in metadata.files:
        try:
            safe_name(entry.path, "file")
        except UnsafeArchive as e:
            raise ImageError(f"the checkpoint's metadata lists an unsafe path: {e}") from None
        if entry.size < 0:
            raise ImageError(f"the checkpoint's metadata gives {entry.path} a negative size")
    declared = sum(f.size for f in metadata.files)
    if declared > limits.max_unpacked_bytes:
        raise ImageError(f"the checkpoint says it unpacks to {declared} bytes, more than the "
                         f"limit of {limits.max_unpacked_bytes} ([restore] max_unpacked_bytes)")
    base = [d.digest for d in metadata.image.layers] if metadata.image else []
    runnable = [d.digest for d in image.runnable_blobs[1:]]
    if runnable[:len(base)] != base:
        raise ImageError("the runnable manifest's layers are not the base image's that the "
                         "checkpoint's metadata names")
    compressed = sum(d.size for d in (*image.payload_layers, *image.own_layers))
    if declared > RATIO_FLOOR and declared > limits.max_ratio * max(compressed, 1):
        raise ImageError(f"the checkpoint says its {compressed} bytes of layers unpack to "
                         f"{declared} bytes, more than {limits.max_ratio} times as many: refused "
                         "as a possible decompression bomb",
                         hint="raise [restore] max_compression_ratio if you trust this image")


def is_state_manifest(document: OciDocument) -> bool:
    """By its artifactType, or (copies by tools that drop it, like skopeo 1.9) its config's type."""
    config = document.get("config")
    return document.get("artifactType") == mt.ARTIFACT_TYPE or (
        isinstance(config, dict) and config.get("mediaType") == mt.CHECKPOINT_CONFIG)


def open_layout(layout_dir: str, ref_name: str | None = None,
                limits: ImageLimits = ImageLimits()) -> CheckpointImage:
    layout = Layout(Path(layout_dir))
    entries = layout.index_entries()
    if len(entries) > limits.max_layers:
        raise ImageError(f"{layout_dir}/index.json names {len(entries)} images: too many")
    named = [e for e in entries if ref_name and e.annotations.get(ann.REF_NAME) == ref_name]
    if named:
        entries = named
    if len(entries) != 1:
        raise ImageError(f"{layout_dir} holds {len(entries)} images; name one "
                         f"({', '.join(e.annotations.get(ann.REF_NAME, e.digest) for e in entries)})")
    index_desc = entries[0]
    index = _parse(layout.read_small(index_desc, limits.max_manifest_bytes, "index"), "index")
    manifests = {}
    children = index.get("manifests", [])
    if not isinstance(children, list) or len(children) > limits.max_layers:
        raise ImageError(f"index {index_desc.digest} has no list of manifests, or too many")
    for entry in children:
        desc = Descriptor.from_json(entry, "index entry")
        manifests[desc.digest] = (desc, _parse(layout.read_small(desc, limits.max_manifest_bytes,
                                                                 "manifest"),
                                               f"manifest {desc.digest}"))
    state_config = next((doc.get("config") for _, doc in manifests.values()
                         if is_state_manifest(doc)), None)
    if state_config is None:
        copied = "layers" in index   # one image manifest where the checkpoint's index belongs
        raise ImageError(f"{layout_dir} is not a torpor checkpoint image: no manifest has "
                         f"artifactType {mt.ARTIFACT_TYPE}",
                         hint="it holds the runnable image alone, as a copy without --all "
                              "leaves it: copy the whole index with `skopeo copy --all "
                              "docker://REF oci:DIR:TAG`" if copied else None)
    config = layout.read_small(Descriptor.from_json(state_config, "config"),
                               limits.max_config_bytes, "checkpoint metadata")
    return assemble(index_desc, index, manifests, config, limits)


# Encrypted layers ----------------------------------------------------------------------------

def check_keys(image: CheckpointImage, keys: Sequence[DecryptionKey]) -> None:
    """DecryptionError unless `keys` open every encrypted layer: from the manifests alone,
    before any layer is downloaded."""
    for layer in (*image.state_layers, *image.own_layers):
        if ocicrypt.is_encrypted(layer.media_type):
            open_layer_key(f"layer {layer.digest}", layer.annotations, keys)


def open_blob(layout: Layout, layer: Descriptor, keys: Sequence[DecryptionKey],
              work_dir: str) -> tuple[str, Descriptor, bool]:
    """A layer as plain bytes: its blob, or, encrypted, a private decrypted copy in `work_dir`
    (the caller removes it: the third value says so). DecryptionError without the right key."""
    path = str(layout.blob_path(layer.digest))
    if not os.path.isfile(path):
        raise ImageError(f"layer {layer.digest} is missing from {layout.root}")
    if not ocicrypt.is_encrypted(layer.media_type):
        return path, layer, False
    fd, plain_path = tempfile.mkstemp(prefix=".plain-", dir=work_dir)
    os.close(fd)
    try:
        plain = ocicrypt.decrypt_blob(path, plain_path, layer.to_json(), keys, durable=False)
    except BaseException:
        os.unlink(plain_path)
        raise
    raw = {k: v for k, v in layer.to_json().items() if k != "annotations"}
    kept = {k: v for k, v in layer.annotations.items()
            if not k.startswith("org.opencontainers.image.enc.")}
    if kept:
        raw["annotations"] = kept
    raw.update(mediaType=plain.media_type, digest=plain.digest, size=plain.size)
    return plain_path, Descriptor(plain.media_type, plain.digest, plain.size, raw), True


def full_metadata(image: CheckpointImage, layout_dir: str, keys: Sequence[DecryptionKey],
                  work_dir: str, limits: ImageLimits = ImageLimits()) -> CheckpointMetadata:
    """All of the checkpoint's metadata: the config, or the (decrypted) metadata layer, which
    must agree with the clear config that the preflight read."""
    layer = image.metadata_layer
    if layer is None:
        return image.metadata
    if layer.size > limits.max_config_bytes:
        raise ImageError(f"the metadata layer {layer.digest} is {layer.size} bytes, more than the "
                         f"limit of {limits.max_config_bytes}")
    layout = Layout(Path(layout_dir))
    path, plain, remove = open_blob(layout, layer, keys, work_dir)
    try:
        data = layout.read_small(plain, limits.max_config_bytes, "checkpoint metadata layer") \
            if not remove else Path(path).read_bytes()
    finally:
        if remove:
            os.unlink(path)
    try:
        metadata = CheckpointMetadata.loads(data, "the checkpoint's metadata layer")
    except FormatError as e:
        raise ImageError(str(e), hint=e.hint) from None
    if clear_metadata.redact(metadata) != image.metadata:
        raise ImageError("the checkpoint's metadata layer does not agree with its clear "
                         "metadata (the config): a damaged or tampered image")
    return metadata


# Unpacking -----------------------------------------------------------------------------------

def unpack_state(image: CheckpointImage, layout_dir: str, target: str, workers: int = 0,
                 keys: Sequence[DecryptionKey] = (), limits: ImageLimits = ImageLimits(),
                 metadata: CheckpointMetadata | None = None,
                 lazy: LazyRebuild | None = None, arrivals: Arrivals | None = None) -> None:
    """The checkpoint directory (CRIU images, torpor state, checkpoint.json) from the state
    layers; the read-write layer stays in the runnable image. Encrypted layers are decrypted in
    a private directory beside `target`. Removes `target` (and that directory) on failure.
    `lazy`: the packs need not be in the layout; `lazy` rebuilds CRIU's images from its own
    chunk source, leaving the lazy pages out (torpor.lazy). `arrivals`: the packs (plain ones
    only) are still arriving, from a download beside this (registry/arrivals.py)."""
    layout = Layout(Path(layout_dir))
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(target, mode=0o700)
    work = tempfile.mkdtemp(prefix=".decrypted-", dir=parent)
    try:
        metadata = metadata or full_metadata(image, layout_dir, keys, work, limits)
        expected = {f.path: f.size for f in metadata.files if f.path != names.ROOTFS_DIFF}
        declared = sum(expected.values())
        _check_free_space(parent, declared + sum(d.size for d in image.payload_layers
                                                 if ocicrypt.is_encrypted(d.media_type)))
        budget = extract.Budget(min(declared, limits.max_unpacked_bytes), limits.max_files,
                                "the checkpoint's metadata")
        layer_list = image.payload_layers
        for layer in layer_list:
            if not layout.has_blob(layer.digest) and not (
                    (lazy is not None or arrivals is not None)
                    and plain_type(layer.media_type) == mt.PACK):
                raise ImageError(f"layer {layer.digest} is missing from {layout_dir}")
        rebuild_chunked(image, layout, target, keys, work, expected, limits.max_chunk_index_bytes,
                        lazy, arrivals)
        layer_list = [d for d in layer_list if plain_type(d.media_type) not in CHUNKED_TYPES]

        def one(layer: Descriptor) -> None:
            path, plain, remove = open_blob(layout, layer, keys, work)
            try:
                extract.extract_layer(path, plain.digest, plain.size, target,
                                      (names.CRIU_DIR, names.CRIU_DUMP_LOG),
                                      f"layer {layer.digest}", expected, budget)
            finally:
                if remove:
                    os.unlink(path)

        with ThreadPoolExecutor(max_workers=workers or min(4, max(1, len(layer_list)))) as pool:
            for future in [pool.submit(one, layer) for layer in layer_list]:
                future.result()
        for path, size in expected.items():
            full = os.path.join(target, path)
            found = os.path.getsize(full) if os.path.isfile(full) and not os.path.islink(full) \
                else -1
            if found != size:
                raise ImageError(f"{path} came out of the image with {found} bytes, "
                                 f"the checkpoint wrote {size}")
        kept = tuple(f for f in metadata.files if f.path != names.ROOTFS_DIFF)
        checkpoint_dir.write_metadata(target, replace(metadata, files=kept, rootfs_in_image=True))
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_free_space(directory: str, needed: int) -> None:
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    if needed > free:
        raise ImageError(f"the checkpoint unpacks to {needed} bytes; {directory} has {free} free",
                         hint="free space there, or point [image] store elsewhere")


# CRIU's images as chunks (docs/format.md "Memory images in chunks") ----------------------------

INDEX_TYPES = (mt.CHUNK_INDEX, mt.CHUNK_INDEX_ZSTD)
CHUNKED_TYPES = (*INDEX_TYPES, mt.PACK)


def is_pack(descriptor: Descriptor) -> bool:
    return plain_type(descriptor.media_type) == mt.PACK


def index_layer(image: CheckpointImage) -> Descriptor | None:
    """The state manifest's chunk index layer; None for an image of CRIU tar parts only."""
    found = [d for d in image.state_layers if plain_type(d.media_type) in INDEX_TYPES]
    if len(found) > 1:
        raise ImageError(f"state manifest {image.state.digest} lists {len(found)} chunk indexes")
    return found[0] if found else None


def read_index(layout: Layout, descriptor: Descriptor, cap: int = MAX_INDEX_BYTES) -> ChunkIndex:
    """A chunk index blob, digest-checked, its size capped before and after decompression
    (index_limit)."""
    return _index_from(layout.read_small(descriptor, cap, "chunk index"), descriptor, cap)


def rebuild_chunked(image: CheckpointImage, layout: Layout, target: str,
                    keys: Sequence[DecryptionKey] = (), work: str | None = None,
                    expected: dict[str, int] | None = None,
                    index_cap: int = MAX_INDEX_BYTES, lazy: LazyRebuild | None = None,
                    arrivals: Arrivals | None = None) -> None:
    """CRIU's image files from the chunk index and its packs, into `target` (reassemble.py:
    limits first, every chunk digest-checked, every file's length checked). Every pack the
    index names must be a layer of the state manifest (so a registry holds it beside the
    image), and every file one of CRIU's that the metadata lists (`expected`), with the size
    it says. Encrypted index and packs are decrypted into `work` first, each checked, and removed after."""
    layer = index_layer(image)
    if layer is None:
        return
    opened: list[str] = []
    try:
        path, plain, remove = open_blob(layout, layer, keys, work or target)
        if remove:
            opened.append(path)
            with open(path, "rb") as f:
                chunks = _index_from(f.read(index_cap + 1), plain, index_cap)
        else:
            chunks = read_index(layout, plain, index_cap)
        packs = {}
        plain_packs = []
        listed = [d for d in image.state_layers if plain_type(d.media_type) == mt.PACK]
        if lazy is not None:   # the packs stay where they are; their sizes must agree
            sizes = {d.digest: d.size for d in listed if not ocicrypt.is_encrypted(d.media_type)}
            odd = [p.digest for p in chunks.packs if sizes.get(p.digest) != p.size]
            if odd:
                raise ImageError(f"the chunk index names packs the state manifest does not list "
                                 f"with that size: {', '.join(odd[:3])}")
            listed = []
        if arrivals is not None:   # in place as they arrive; sizes checked then (reassemble)
            if any(ocicrypt.is_encrypted(d.media_type) for d in listed):
                raise ImageError("encrypted packs are decrypted whole: they cannot be read as "
                                 "they arrive")
            packs = {d.digest: str(layout.blob_path(d.digest)) for d in listed}
            listed = []
        for pack in listed:
            pack_path, pack_plain, remove = open_blob(layout, pack, keys, work or target)
            if remove:
                opened.append(pack_path)  # decrypted: checked by its HMAC and sealed digest
            else:
                plain_packs.append((pack_plain, pack_path))
            packs[pack_plain.digest] = pack_path
        _check_sizes(plain_packs)
        unlisted = [p.digest for p in chunks.packs if p.digest not in packs and lazy is None]
        if unlisted:
            raise ImageError(f"the chunk index names packs the state manifest does not list: "
                             f"{', '.join(unlisted[:3])}")
        outside = [f.name for f in chunks.files if not f.name.startswith(names.CRIU_DIR + "/")
                   or f.name.split("/")[-1].startswith(names.STATE_PREFIX)
                   or (expected is not None and expected.get(f.name) != f.size)]
        if outside:
            raise ImageError(f"the chunk index holds files the checkpoint's metadata does not "
                             f"list as CRIU's images: {outside[:3]}")
        if lazy is not None:
            lazy.rebuild(chunks, target)
        else:
            reassemble.rebuild(chunks, packs.__getitem__, target, arrivals=arrivals)
    finally:
        for path in opened:
            os.unlink(path)


def _check_sizes(blobs: list[tuple[Descriptor, str]]) -> None:
    """Each pack's size against its descriptor. Its bytes are not hashed whole here: every
    chunk read from it is checked against its own sha256 in the index (itself digest-checked,
    and the packs of a pull were checked as they arrived), and nothing else of it is read."""
    for blob, path in blobs:
        what = f"pack {blob.digest}"
        size = os.stat(path).st_size
        if size < blob.size:
            raise ImageError(f"{what} is truncated: {size} of {blob.size} bytes")
        if size > blob.size:
            raise DigestMismatch(f"{what} is larger than its descriptor's {blob.size} bytes")


def index_limit(layer_size: int, cap: int = MAX_INDEX_BYTES) -> int:
    """What a zstd chunk index blob of `layer_size` bytes may unpack to: INDEX_RATIO times its
    size, at least INDEX_FLOOR, at most `cap` ([restore] max_chunk_index_bytes)."""
    return min(cap, max(INDEX_FLOOR, INDEX_RATIO * layer_size))


def _index_from(data: bytes, descriptor: Descriptor, cap: int = MAX_INDEX_BYTES) -> ChunkIndex:
    """The index from its blob. A compressed one is unpacked as a stream, never past
    index_limit, so that a small hostile layer costs little memory and time before it is
    refused; the JSON's elements are then at most that many bytes' worth."""
    if len(data) > cap:
        raise ImageError(f"chunk index {descriptor.digest} is over {cap} bytes",
                         hint=INDEX_HINT)
    if descriptor.media_type == mt.CHUNK_INDEX_ZSTD:
        limit = index_limit(len(data), cap)
        try:
            declared = zstandard.frame_content_size(data)
            if declared > limit:
                raise _index_over(descriptor, len(data), limit, f"{declared} bytes")
            reader = zstandard.ZstdDecompressor().stream_reader(data)
            plain = bytearray()
            while len(plain) <= limit:
                piece = reader.read(min(1 << 20, limit + 1 - len(plain)))
                if not piece:
                    break
                plain += piece
        except zstandard.ZstdError as e:
            raise ImageError(f"chunk index {descriptor.digest} is not a zstd frame: {e}") from None
        if len(plain) > limit:
            raise _index_over(descriptor, len(data), limit, f"over {limit} bytes")
        data = bytes(plain)
    return ChunkIndex.from_json(data, cap)


def _index_over(descriptor: Descriptor, size: int, limit: int, amount: str) -> ImageError:
    return ImageError(f"chunk index {descriptor.digest} ({size} bytes) unpacks to {amount}: an "
                      f"index of that size may unpack to {limit} bytes ({INDEX_RATIO} times its "
                      f"size, at least {INDEX_FLOOR})", hint=INDEX_HINT)


def import_runnable(client: Client, image: CheckpointImage, layout_dir: str, name: str,
                    keys: Sequence[DecryptionKey] = (), work_dir: str | None = None,
                    ) -> BaseImage:
    """Put the runnable image into containerd's content store and name it `name`. Its own
    layers (the read-write layer) are decrypted first when encrypted, into `work_dir`, and
    checked not to inflate beyond what the metadata declares."""
    layout = Layout(Path(layout_dir))
    blobs = image.runnable_blobs
    base_count = len(blobs) - len(image.own_layers)
    declared = next((f.size for f in image.metadata.files if f.path == names.ROOTFS_DIFF), 0)
    work = tempfile.mkdtemp(prefix=".runnable-", dir=work_dir or layout_dir)
    try:
        plain_blobs: list[Descriptor] = []
        for i, blob in enumerate(blobs):
            if i < base_count:
                path, plain = str(layout.blob_path(blob.digest)), blob
            else:
                path, plain, _ = open_blob(layout, blob, keys, work)
                extract.check_inflation(path, plain.media_type, declared,
                                        f"the read-write layer {blob.digest}")
            try:  # already in containerd: not read at all
                client.write_file(f"torpor-{plain.digest}", path, plain.size, plain.digest)
            except FileNotFoundError:
                raise ImageError(f"blob {blob.digest} is missing from {layout_dir}") from None
            plain_blobs.append(plain)
        manifest = dict(image.runnable_manifest)
        if plain_blobs[1:] != blobs[1:]:   # decrypted: a manifest that names the plain layers
            manifest["layers"] = [d.to_json() for d in plain_blobs[1:]]
            body = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
        else:
            body = Path(layout.blob_path(image.runnable.digest)).read_bytes()
        manifest_path = os.path.join(work, "manifest.json")
        with open(manifest_path, "wb") as f:
            f.write(body)
        digest = sha256_digest(body)
        labels = {"containerd.io/gc.ref.content.config": blobs[0].digest}
        labels.update({f"containerd.io/gc.ref.content.l.{i}": b.digest
                       for i, b in enumerate(plain_blobs[1:])})
        client.write_file(f"torpor-{digest}", manifest_path, len(body), digest, labels=labels)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    target = types_pb2.Descriptor(media_type=mt.OCI_MANIFEST, digest=digest, size=len(body))
    record = images_pb2.Image(name=name, target=target,
                              labels={ann.IMAGE_CHECKPOINT: image.index.digest})
    try:
        client.create_image(record)
    except AlreadyExists:
        client.update_image(record)
    return containerd_image.image_chain(client, name)


def ensure_restorable(metadata: CheckpointMetadata) -> None:
    if not metadata.container.spec:
        raise RestoreError("the checkpoint metadata holds no container spec")
