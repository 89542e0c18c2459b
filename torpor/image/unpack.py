"""Reading a checkpoint image back: find its two manifests, check it, unpack the state layers
into a checkpoint directory, and put the runnable image into containerd.

Nothing is trusted before it is checked: manifests and the metadata are digest-checked (by the
layout or the registry client), every layer's digest is checked as it is extracted, every
extracted file's size is checked against the metadata, and layers of media types this torpor
does not know are refused before anything is written.
"""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from torpor.containerd import images as containerd_image
from torpor.containerd.api import images_pb2, types_pb2
from torpor.containerd.client import Client
from torpor.errors import AlreadyExists, FormatError, ImageError, RestoreError
from torpor.formats import annotations as ann
from torpor.formats import mediatypes as mt
from torpor.formats import names
from torpor.formats.metadata import BaseImage, CheckpointMetadata
from torpor.formats.oci import Descriptor, OciDocument
from torpor.image import directory as checkpoint_dir
from torpor.image import extract
from torpor.registry.layout import Layout

MANIFEST_LIMIT = 4 << 20
CONFIG_LIMIT = 16 << 20


@dataclass
class CheckpointImage:
    index: Descriptor
    runnable: Descriptor
    runnable_manifest: dict[str, Any]
    state: Descriptor
    state_manifest: dict[str, Any]
    metadata: CheckpointMetadata

    @property
    def state_layers(self) -> list[Descriptor]:
        return [Descriptor.from_json(layer, f"state manifest layer {i}")
                for i, layer in enumerate(self.state_manifest.get("layers", []))]

    @property
    def runnable_blobs(self) -> list[Descriptor]:
        doc = self.runnable_manifest
        return [Descriptor.from_json(doc["config"], "runnable config"),
                *(Descriptor.from_json(layer, f"runnable layer {i}")
                  for i, layer in enumerate(doc.get("layers", [])))]


def _parse(body: bytes, what: str) -> OciDocument:
    try:
        document = json.loads(body)
    except ValueError:
        raise ImageError(f"{what} is not JSON") from None
    if not isinstance(document, dict):
        raise ImageError(f"{what} is not a JSON object")
    return document


def assemble(index_desc: Descriptor, index: OciDocument,
             manifests: dict[str, tuple[Descriptor, dict[str, Any]]],
             config: bytes) -> CheckpointImage:
    """The checkpoint image from its documents, checked for the shape docs/format.md gives."""
    runnable = state = None
    for entry in index.get("manifests", []):
        desc = Descriptor.from_json(entry, "index entry")
        role = desc.annotations.get(ann.ROLE)
        if desc.artifact_type == mt.ARTIFACT_TYPE or role == "state":
            state = desc
        elif role == "runnable" or (desc.platform or {}).get("os") == "linux":
            runnable = desc
    if state is None or runnable is None:
        raise ImageError(f"{index_desc.digest} is not a torpor checkpoint image: its index lacks "
                         "a runnable manifest or a state manifest "
                         f"(artifactType {mt.ARTIFACT_TYPE})")
    state_doc = manifests[state.digest][1]
    runnable_doc = manifests[runnable.digest][1]
    if state_doc.get("config", {}).get("mediaType") != mt.CHECKPOINT_CONFIG:
        raise ImageError(f"state manifest {state.digest} has config type "
                         f"{state_doc.get('config', {}).get('mediaType')!r}, not "
                         f"{mt.CHECKPOINT_CONFIG}")
    for layer in state_doc.get("layers", []):
        if layer.get("mediaType") not in mt.STATE_LAYER_TYPES:
            raise ImageError(f"state manifest {state.digest} has a layer of unknown media type "
                             f"{layer.get('mediaType')!r}: this torpor cannot restore it",
                             hint="a newer torpor may know it")
    for layer in runnable_doc.get("layers", []):
        if layer.get("mediaType") not in mt.OCI_LAYER_TYPES:
            raise ImageError(f"runnable manifest {runnable.digest} has a layer of unknown media "
                             f"type {layer.get('mediaType')!r}")
    try:
        metadata = CheckpointMetadata.loads(config, "checkpoint metadata")
    except FormatError as e:
        raise ImageError(str(e), hint=e.hint) from None
    return CheckpointImage(index_desc, runnable, runnable_doc, state, state_doc, metadata)


def open_layout(layout_dir: str, ref_name: str | None = None) -> CheckpointImage:
    layout = Layout(Path(layout_dir))
    entries = layout.index_entries()
    named = [e for e in entries if ref_name and e.annotations.get(ann.REF_NAME) == ref_name]
    if named:
        entries = named
    if len(entries) != 1:
        raise ImageError(f"{layout_dir} holds {len(entries)} images; name one "
                         f"({', '.join(e.annotations.get(ann.REF_NAME, e.digest) for e in entries)})")
    index_desc = entries[0]
    index = _parse(layout.read_small(index_desc, MANIFEST_LIMIT, "index"), "index")
    manifests = {}
    for entry in index.get("manifests", []):
        desc = Descriptor.from_json(entry, "index entry")
        manifests[desc.digest] = (desc, _parse(layout.read_small(desc, MANIFEST_LIMIT, "manifest"),
                                               f"manifest {desc.digest}"))
    state_config = next((doc["config"] for _, doc in manifests.values()
                         if doc.get("artifactType") == mt.ARTIFACT_TYPE), None)
    if state_config is None:
        raise ImageError(f"{layout_dir} is not a torpor checkpoint image: no manifest has "
                         f"artifactType {mt.ARTIFACT_TYPE}")
    config = layout.read_small(Descriptor.from_json(state_config, "config"), CONFIG_LIMIT,
                               "checkpoint metadata")
    return assemble(index_desc, index, manifests, config)


def unpack_state(image: CheckpointImage, layout_dir: str, target: str, workers: int = 0) -> None:
    """The checkpoint directory (CRIU images, torpor state, checkpoint.json) from the state
    layers; the read-write layer stays in the runnable image. Removes `target` on failure."""
    layout = Layout(Path(layout_dir))
    os.makedirs(target, mode=0o700)
    try:
        layer_list = image.state_layers
        for layer in layer_list:
            if not layout.has_blob(layer.digest):
                raise ImageError(f"layer {layer.digest} is missing from {layout_dir}")
        with ThreadPoolExecutor(max_workers=workers or min(4, max(1, len(layer_list)))) as pool:
            futures = [pool.submit(extract.extract_layer, str(layout.blob_path(layer.digest)),
                                   layer.digest, layer.size, target,
                                   (names.CRIU_DIR, names.CRIU_DUMP_LOG),
                                   f"layer {layer.digest}") for layer in layer_list]
            for future in futures:
                future.result()
        expected = tuple(f for f in image.metadata.files if f.path != names.ROOTFS_DIFF)
        for entry in expected:
            path = os.path.join(target, entry.path)
            size = os.path.getsize(path) if os.path.isfile(path) else -1
            if size != entry.size:
                raise ImageError(f"{entry.path} came out of the image with {size} bytes, "
                                 f"the checkpoint wrote {entry.size}")
        checkpoint_dir.write_metadata(target, replace(image.metadata, files=expected,
                                                      rootfs_in_image=True))
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def import_runnable(client: Client, image: CheckpointImage, layout_dir: str,
                    name: str) -> BaseImage:
    """Put the runnable image into containerd's content store and name it `name`."""
    layout = Layout(Path(layout_dir))
    blobs = image.runnable_blobs
    for blob in blobs:  # already in containerd: not read at all
        try:
            client.write_file(f"torpor-{blob.digest}", str(layout.blob_path(blob.digest)),
                              blob.size, blob.digest)
        except FileNotFoundError:
            raise ImageError(f"blob {blob.digest} is missing from {layout_dir}") from None
    manifest_path = layout.blob_path(image.runnable.digest)
    labels = {"containerd.io/gc.ref.content.config": blobs[0].digest}
    labels.update({f"containerd.io/gc.ref.content.l.{i}": b.digest
                   for i, b in enumerate(blobs[1:])})
    client.write_file(f"torpor-{image.runnable.digest}", str(manifest_path),
                      image.runnable.size, image.runnable.digest, labels=labels)
    target = types_pb2.Descriptor(media_type=mt.OCI_MANIFEST, digest=image.runnable.digest,
                                  size=image.runnable.size)
    record = images_pb2.Image(name=name, target=target,
                              labels={ann.IMAGE_CHECKPOINT: image.index.digest})
    try:
        client.create_image(record)
    except AlreadyExists:
        client.update_image(record)
    return containerd_image.image_chain(client, name)


def ensure_restorable(image: CheckpointImage) -> None:
    if not image.metadata.container.spec:
        raise RestoreError("the checkpoint metadata holds no container spec")
