"""`torpor kube`: one world of checkpoints for torpor and Kubernetes.

- `archive SOURCE -o FILE`: a torpor checkpoint (directory, layout, local image or registry
  image) as a kubelet checkpoint archive, which a pod restores through containerd's CRI;
- `import ARCHIVE (-o DIR | -t REF [--push] | -o DIR --oci)`: a kubelet checkpoint archive as a
  torpor checkpoint, to push, inspect and restore with torpor (`torpor restore ARCHIVE` does
  this in scratch space on its own);
- `image SOURCE (-t REF --push | -o DIR)`: the checkpoint OCI image Kubernetes restores from
  (image/kube_image.py), from a kubelet archive or any torpor checkpoint.

Steps of `import`, in order: 1. read the archive's records and torpor-runc's state (none: a
plain runc pod's checkpoint, given a state that says so); 2. find its base image in containerd
(the node's CRI namespace, where the pod pulled it); 3. extract it into scratch space and lay it
out as a checkpoint directory (CRIU's images with runc's descriptors.json back, the read-write
layer decompressed, CRIU's log); 4. write checkpoint.json; 5. images only: compress the layers
and push. Steps of `archive`: 1. the checkpoint as a directory (images: the state layers
unpacked, the read-write layer taken as its blob); 2. the archive, descriptors.json under
torpor's name. Nothing is left behind on failure, and the source is only read.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torpor
from torpor import output_path, signing
from torpor.config import Config
from torpor.containerd import images as containerd_image
from torpor.containerd.client import Client
from torpor.errors import ImageError, NotFound
from torpor.formats import annotations as ann
from torpor.formats import kube, names
from torpor.formats.criu import CriuOptions
from torpor.formats.files import FileEntry, FilePolicy, Sizes
from torpor.formats.metadata import BaseImage, CheckpointMetadata, ContainerInfo, RuntimeInfo
from torpor.formats.network import NetworkState
from torpor.formats.node import NodeFacts
from torpor.formats.request import CheckpointRequest
from torpor.formats.state import ContainerState
from torpor.image import build as image_build
from torpor.image import directory as checkpoint_dir
from torpor.image import encrypt_layout, kube_archive, kube_image, sound_indexes, unpack
from torpor.image.encryption_keys import node_keys, node_recipients
from torpor.image.store import Store
from torpor.ops.access import NO_CREDENTIALS, RegistryAccess
from torpor.ops.sources import SourceKind, image_of_plan, kind_of, registry_options, tag_of
from torpor.registry import fetch_metadata, push_layout
from torpor.reporting import SILENT, Progress

RUNC_SHIM = "io.containerd.runc.v2"
UNKNOWN_NODE = NodeFacts(architecture="", kernel="", criu_version="unknown",
                         runc_version="unknown", cgroup_version=0)


@dataclass(frozen=True)
class KubeResult:
    """What `torpor kube` made: an archive, a checkpoint directory, a layout or a pushed image."""

    container: str
    archive: str | None = None
    directory: str | None = None
    layout: str | None = None
    reference: str | None = None
    digest: str | None = None
    bytes: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


# torpor -> kubelet -------------------------------------------------------------------------

def archive(source: str, out_path: str, cfg: Config, access: RegistryAccess = NO_CREDENTIALS,
            progress: Progress = SILENT) -> KubeResult:
    started = time.monotonic()
    store = Store(cfg.image_store)
    out_path = os.path.abspath(out_path)
    output_path.check_parents(out_path, "the checkpoint archive", ImageError)
    with store.scratch() as scratch, _as_directory(source, store, cfg, access, Path(scratch),
                                                   progress) as (directory, rw_layer):
        progress.step(f"writing the kubelet checkpoint archive {out_path}")
        metadata = checkpoint_dir.load(directory)
        size = write_archive(directory, metadata, rw_layer, out_path, Path(scratch))
    return KubeResult(metadata.container.id, archive=out_path, bytes=size,
                      seconds=time.monotonic() - started)


def write_archive(directory: str, metadata: CheckpointMetadata, rw_layer: str | None,
                  out_path: str, scratch: Path) -> int:
    """A checkpoint directory as a kubelet archive; `rw_layer`: the read-write layer as a
    compressed blob, else the directory's rootfs-diff.tar is compressed here."""
    if rw_layer is None:
        plain = os.path.join(directory, names.ROOTFS_DIFF)
        if os.path.exists(plain) and os.path.getsize(plain) > 0:
            rw_layer = str(scratch / "rootfs-diff.tar.zst")
            kube_archive.compress_layer(plain, rw_layer)
    log = os.path.join(directory, names.CRIU_DUMP_LOG)
    criu = kube_archive.criu_files(os.path.join(directory, names.CRIU_DIR),
                                   hide_descriptors=True)
    config, status = records_of(metadata)
    return kube_archive.write(out_path, kube_archive.ArchiveParts(
        criu_files=tuple(criu), config=config, spec=pod_spec_of(metadata), status=status,
        rootfs_diff=rw_layer,
        extras=((names.KUBE_DUMP_LOG, log),) if os.path.exists(log) else ()))


def records_of(metadata: CheckpointMetadata) -> tuple[kube.KubeContainerConfig,
                                                       kube.KubeContainerStatus]:
    """config.dump and status.dump for a torpor checkpoint."""
    container, base = metadata.container, metadata.image
    if base is None:
        raise ImageError("the checkpoint records no base image: a pod cannot restore it")
    ref = base_image_ref(base)
    name = container_name(metadata)
    config = kube.KubeContainerConfig(
        id=container.id, name=name, rootfs_image=base.name, rootfs_image_ref=ref,
        rootfs_image_name=base.name, runtime=container.runtime.name or RUNC_SHIM,
        checkpointed=metadata.created or kube.GO_ZERO_TIME)
    labels = {k: v for k, v in container.labels.items() if k.startswith("io.kubernetes.")}
    status = kube.KubeContainerStatus(id=container.id, name=name, image=base.name,
                                      image_ref=ref, labels=labels)
    return config, status


def base_image_ref(base: BaseImage) -> str:
    """NAME@DIGEST, which containerd pulls again when a pod restores the checkpoint."""
    if "@" in base.name:
        return base.name
    last = base.name.rsplit("/", 1)[-1]
    repository = base.name[:-len(last)] + last.split(":", 1)[0]
    return f"{repository}@{base.target.digest}"


def container_name(metadata: CheckpointMetadata) -> str:
    spec_annotations = metadata.container.spec.get("annotations") or {}
    return (str(spec_annotations.get(ann.CRI_CONTAINER_NAME) or "")
            or metadata.container.labels.get("io.kubernetes.container.name")
            or metadata.container.id)


def pod_spec_of(metadata: CheckpointMetadata) -> dict[str, Any]:
    """The spec for spec.dump, naming the container the way CRI does (checkpointctl shows it)."""
    spec = dict(metadata.container.spec)
    annotations = dict(spec.get("annotations") or {})
    annotations.setdefault(ann.CRI_CONTAINER_NAME, container_name(metadata))
    spec["annotations"] = annotations
    return spec


@contextlib.contextmanager
def _as_directory(source: str, store: Store, cfg: Config, access: RegistryAccess,
                  scratch: Path, progress: Progress, clear_to: str | None = None
                  ) -> Iterator[tuple[str, str | None]]:
    """(checkpoint directory, the read-write layer's compressed blob or None) for any torpor
    checkpoint; images are downloaded (registry) and their state layers unpacked (an encrypted
    one's with the node's keys, refused where it would then go to `clear_to` in the clear)."""
    kind = kind_of(source, store)
    if kind is SourceKind.KUBE_ARCHIVE:
        raise ImageError(f"{source} already is a kubelet checkpoint archive")
    if kind is SourceKind.DIRECTORY:
        checkpoint_dir.load(source)
        yield os.path.abspath(source), None
        return
    if kind is SourceKind.REGISTRY:
        progress.step(f"fetching {source}")
        signed: list[signing.SignatureCheck] = []   # the node's signature policy, first
        with fetch_metadata(source, registry_options(cfg, source, access),
                            signing.checker(cfg, source, signed)) as plan:
            progress.step(signed[0].describe())
            image = image_of_plan(plan)
            layout = str(store.prepare(source))
            plan.download(layout, progress=progress.transfer("downloaded"))
    else:
        layout = source if kind is SourceKind.LAYOUT else str(store.layout(source))
        image = unpack.open_layout(layout)
    if image.sealed and clear_to:
        raise ImageError(f"{source} is encrypted, and this node encrypts nothing it builds: its "
                         f"memory would go to {clear_to} in the clear",
                         hint="set [image] encrypt_recipients on this node (docs/encryption.md)")
    progress.step("unpacking the state layers")
    directory = str(scratch / "checkpoint")
    keys = node_keys(cfg) if image.encrypted else ()   # [restore] decryption_keys
    unpack.check_keys(image, keys)
    metadata = unpack.full_metadata(image, layout, keys, str(scratch))
    unpack.unpack_state(image, layout, directory, keys=keys, metadata=metadata)
    base_layers = len(metadata.image.layers) if metadata.image else 0
    layers = image.runnable_blobs[1:]
    rw_layer = None
    if len(layers) > base_layers:
        from torpor.registry.layout import Layout

        rw_layer, _, _ = unpack.open_blob(Layout(Path(layout)), layers[-1], keys, str(scratch))
    yield directory, rw_layer


# kubelet -> torpor -------------------------------------------------------------------------

def import_archive(client: Client, archive_path: str, cfg: Config, *,
                   directory: str | None = None, oci: bool = False, ref: str | None = None,
                   push: bool = False, access: RegistryAccess = NO_CREDENTIALS,
                   progress: Progress = SILENT) -> KubeResult:
    """The archive as a checkpoint directory (`directory`), a layout (`oci`), or an image in
    the local store (`ref`), pushed with `push`."""
    started = time.monotonic()
    progress.step(f"reading {archive_path}")
    found = kube_archive.read(archive_path)
    if ref is None and not oci:
        assert directory is not None
        target = os.path.abspath(directory)
        if os.path.exists(target):
            raise ImageError(f"{target} exists", hint="pick a new -o DIR")
        output_path.check_parents(target, "the checkpoint", ImageError)
        try:
            to_directory(client, found, target, progress)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        return KubeResult(found.config.id, archive=archive_path, directory=target,
                          seconds=time.monotonic() - started)
    store = Store(cfg.image_store)
    recipients = node_recipients(cfg)                        # [image] encrypt_recipients
    if oci and directory:
        output_path.prepare_dir(directory, "the checkpoint image", ImageError,
                                must_be_empty=False, create=False)
    with store.scratch() as scratch:
        work = str(Path(scratch) / "checkpoint")
        to_directory(client, found, work, progress)
        layout_dir = directory if oci and directory else str(store.prepare(ref or ""))
        progress.step("compressing layers (zstd, in parallel)")
        built = image_build.build(client, work, layout_dir, ref_name=tag_of(ref),
                                  level=cfg.image_zstd_level)
        sound_indexes.record(store.root, built.chunk_index)  # a basis for a next generation
        if recipients:
            progress.step(f"encrypting the layers for {len(recipients)} recipient(s)")
            built = encrypt_layout.encrypt_built(built, recipients, tag_of(ref))
    signing.own.record(cfg.image_store, built.index.digest)   # made here (torpor.signing.own)
    reference = digest = None
    if push and ref:
        progress.step(f"pushing {ref}")
        options = registry_options(cfg, ref, access)
        pushed = push_layout(built.layout, ref, options=options,
                             progress=progress.transfer("uploaded"))
        reference, digest = str(pushed.reference), pushed.digest
        signing.sign_with_node_key(ref, digest, cfg.image_signing_key, options)
    return KubeResult(found.config.id, archive=archive_path, layout=str(built.layout),
                      reference=reference or ref, digest=digest or built.index.digest,
                      bytes=built.compressed_bytes, seconds=time.monotonic() - started)


def to_directory(client: Client, found: kube_archive.KubeArchive, target: str,
                 progress: Progress = SILENT) -> CheckpointMetadata:
    """A checkpoint directory at `target` (new) from a kubelet archive."""
    base = _base_image(client, found)
    extracted = f"{target}.archive"
    progress.step("extracting the archive")
    kube_archive.extract(found.path, extracted)
    try:
        os.makedirs(target, mode=0o700)
        criu = os.path.join(target, names.CRIU_DIR)
        os.replace(os.path.join(extracted, names.KUBE_CHECKPOINT_DIR), criu)
        hidden = os.path.join(criu, names.HIDDEN_DESCRIPTORS)
        if os.path.exists(hidden):
            os.replace(hidden, os.path.join(criu, names.RUNC_DESCRIPTORS))
        diff = os.path.join(extracted, names.KUBE_ROOTFS_DIFF)
        if os.path.exists(diff):
            kube_archive.decompress_layer(diff, os.path.join(target, names.ROOTFS_DIFF))
        log = os.path.join(extracted, names.KUBE_DUMP_LOG)
        if os.path.exists(log):
            os.replace(log, os.path.join(target, names.CRIU_DUMP_LOG))
    finally:
        shutil.rmtree(extracted, ignore_errors=True)
    metadata = metadata_of(found, base, checkpoint_dir.inventory(target))
    checkpoint_dir.write_metadata(target, metadata)
    return metadata


def metadata_of(found: kube_archive.KubeArchive, base: BaseImage | None,
                files: tuple[FileEntry, ...]) -> CheckpointMetadata:
    """checkpoint.json for a kubelet archive. The node it was taken on is not recorded: its
    facts stay unknown, and CRIU checks them when it restores."""
    state = found.state or plain_runc_state(found)
    labels = dict(found.status.labels) if found.status else {}
    labels.setdefault("io.kubernetes.container.name", found.container_name)
    return CheckpointMetadata(
        torpor_version=torpor.__version__, created=found.config.checkpointed,
        container=ContainerInfo(id=found.config.id,
                                image=base.name if base else found.config.rootfs_image_name,
                                runtime=RuntimeInfo(name=found.config.runtime or RUNC_SHIM),
                                spec=found.spec, labels=labels, snapshotter="overlayfs"),
        image=base, request=CheckpointRequest(criu=state.criu), node=UNKNOWN_NODE, state=state,
        sizes=Sizes(memory_pages=sum(f.size for f in files
                                     if os.path.basename(f.path).startswith("pages-")),
                    total=sum(f.size for f in files),
                    rootfs_diff=next((f.size for f in files
                                      if f.path in (names.ROOTFS_DIFF, names.KUBE_ROOTFS_DIFF)),
                                     0)),
        files=files)


def plain_runc_state(found: kube_archive.KubeArchive) -> ContainerState:
    """What containerd's CRI asked of plain runc: leave it running, nothing else saved."""
    return ContainerState(torpor_version="", container_id=found.config.id, init_pid=0,
                          criu=CriuOptions(leave_running=True),
                          policy=FilePolicy(volumes="none", dev_shm=False, rootfs=False),
                          network=NetworkState(netns_path="", created_by_runtime=False))


def _base_image(client: Client, found: kube_archive.KubeArchive) -> BaseImage:
    name = found.config.rootfs_image_name or found.config.rootfs_image
    for candidate in (name, found.config.rootfs_image_ref):
        if not candidate:
            continue
        try:
            chain = containerd_image.image_chain(client, candidate)
        except NotFound:
            continue
        return replace(chain, name=name)
    raise ImageError(f"the checkpoint's base image {found.config.rootfs_image_ref or name} is "
                     f"not in containerd's namespace {client.namespace}",
                     hint=f"pull it there first (crictl pull {name}), or name the namespace "
                     "the pod's node uses (-n k8s.io)")


# the checkpoint OCI image ------------------------------------------------------------------

def image(source: str, cfg: Config, *, ref: str | None = None, directory: str | None = None,
          access: RegistryAccess = NO_CREDENTIALS, progress: Progress = SILENT) -> KubeResult:
    """The checkpoint image Kubernetes restores from: into the layout `directory`, and/or
    pushed to `ref`."""
    started = time.monotonic()
    store = Store(cfg.image_store)
    recipients = node_recipients(cfg)                        # [image] encrypt_recipients
    if directory:
        output_path.prepare_dir(directory, "the checkpoint image", ImageError,
                                must_be_empty=False, create=False)
    with store.scratch() as scratch:
        if kube_archive.is_archive(source):
            archive_path = source
        else:
            archive_path = str(Path(scratch) / "checkpoint.tar")
            clear_to = ref if ref and not recipients else None
            with _as_directory(source, store, cfg, access, Path(scratch), progress,
                               clear_to) as (checkpoint, rw_layer):
                progress.step("writing a kubelet checkpoint archive")
                write_archive(checkpoint, checkpoint_dir.load(checkpoint), rw_layer,
                              archive_path, Path(scratch))
        found = kube_archive.read(archive_path)
        layout_dir = directory or str(Path(scratch) / "layout")
        progress.step("compressing the archive into the image's layer (zstd)")
        built = kube_image.build(found, layout_dir, tag_of(ref), cfg.image_zstd_level,
                                 recipients)
        reference = None
        if ref:
            progress.step(f"pushing {ref}")
            options = registry_options(cfg, ref, access)
            pushed = push_layout(built.layout, ref, options=options,
                                 progress=progress.transfer("uploaded"))
            reference = str(pushed.reference)
            signing.sign_with_node_key(ref, pushed.digest, cfg.image_signing_key, options)
    return KubeResult(found.config.id, archive=source if archive_path == source else None,
                      layout=directory, reference=reference, digest=built.manifest.digest,
                      bytes=built.layer.size, seconds=time.monotonic() - started)
