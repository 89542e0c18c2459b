"""`torpor import CONTAINER CHECKPOINT`: a checkpoint that nerdctl made (`nerdctl checkpoint
create`) of a container run under torpor-runc, as a torpor checkpoint: a directory (-o DIR), an
image in the local store (-t REF), pushed (--push), or an OCI layout (-o DIR --oci); `torpor
push` and `torpor restore` take it from there, to any node.

nerdctl keeps CRIU's images unpacked in <data-root>/checkpoints/NAME, torpor-runc's state among
them (containerd tars the whole image directory), but not the container's spec, image or
read-write layer: nerdctl restores into the same container. Those come from containerd, where
the container stays after the checkpoint.

Steps, in order (nerdctl's checkpoint is only read; a failure leaves no output behind):
 1. find the checkpoint: a directory, or NAME in nerdctl's checkpoint directory; it must hold
    CRIU's images and torpor-runc's state;
 2. find the container: its containerd ID, nerdctl name or a unique ID prefix; it must run
    under torpor-runc and be the container the checkpoint is of;
 3. lay out a checkpoint directory: CRIU's images (hard links where the filesystem allows) and
    the read-write layer (torpor-runc's copy, else containerd's diff service);
 4. make it restorable where there is no nerdctl: drop nerdctl's OCI hooks (they run this
    node's nerdctl), and save the files nerdctl bind-mounts (/etc/hosts, /etc/resolv.conf,
    /etc/hostname) with the checkpoint, for torpor-runc to put back on restore like volumes;
 5. write checkpoint.json;
 6. -t REF or --oci: compress the layers into an OCI layout; --push: push it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torpor
from torpor import output_path, signing
from torpor.capture import volumes as saved_volumes
from torpor.config import Config
from torpor.containerd import images as containerd_image
from torpor.containerd import nerdctl, snapshots
from torpor.containerd import runtime as runc_runtime
from torpor.containerd.api import containers_pb2
from torpor.containerd.client import Client
from torpor.errors import CheckpointError, FormatError
from torpor.formats import names, timestamps
from torpor.formats import state as container_state
from torpor.formats.files import SavedVolume, Sizes
from torpor.formats.metadata import BaseImage, CheckpointMetadata, ContainerInfo, RuntimeInfo
from torpor.formats.request import CheckpointRequest
from torpor.formats.state import ContainerState
from torpor.image import build as image_build
from torpor.image import directory as checkpoint_dir
from torpor.image import encrypt_layout, sound_indexes
from torpor.image.encryption_keys import node_recipients
from torpor.image.store import Store
from torpor.node import runtime as runtime_tools
from torpor.ops.checkpoint import CheckpointTarget
from torpor.ops.sources import mount_from, registry_options, tag_of
from torpor.registry import push_layout
from torpor.reporting import SILENT, Progress


@dataclass(frozen=True)
class ImportResult:
    container: str                   # containerd's ID
    checkpoint: str                  # nerdctl's checkpoint directory
    sizes: Sizes
    timings: dict[str, float]
    dropped_hooks: int               # nerdctl's OCI hooks left out of the spec
    directory: str | None = None
    ref: str | None = None
    layout: str | None = None
    digest: str | None = None
    pushed: str | None = None        # the reference pushed

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "sizes": self.sizes.__dict__}


def import_checkpoint(client: Client, container_name: str, checkpoint: str,
                      target: CheckpointTarget, cfg: Config, progress: Progress = SILENT,
                      data_root: str = nerdctl.DATA_ROOT, checkpoints_in: str | None = None
                      ) -> ImportResult:
    started = time.monotonic()
    # 1. the checkpoint
    source = nerdctl.checkpoint_path(checkpoint, checkpoints_in, data_root)
    progress.step(f"reading nerdctl's checkpoint {source}")
    state = _read_state(source)
    # 2. the container
    container = nerdctl.find_container(client, container_name)
    runtime = runc_runtime.require_torpor(container)
    if state.container_id != container.id:
        raise CheckpointError(f"{source} is a checkpoint of container {state.container_id[:12]}, "
                              f"not of {container_name} ({container.id[:12]})")
    image = containerd_image.image_chain(client, container.image) if container.image else None
    # 3-5. the checkpoint directory, then 6. the image
    if target.ref is None and not target.oci:
        assert target.directory is not None
        directory = os.path.abspath(target.directory)
        with _fresh_directory(directory):
            metadata, dropped = _lay_out(client, container, runtime, image, state, source,
                                         directory, cfg, progress, started)
        return ImportResult(container.id, source, metadata.sizes,
                            {"total_s": time.monotonic() - started}, dropped, directory=directory)
    store = Store(cfg.image_store)
    ref = target.ref
    recipients = node_recipients(cfg, target.recipients)   # and [image] encrypt_recipients
    if target.oci and target.directory:
        output_path.prepare_dir(target.directory, "the checkpoint image", CheckpointError,
                                must_be_empty=False, create=False)
    with store.scratch() as scratch:
        directory = str(scratch / "checkpoint")
        metadata, dropped = _lay_out(client, container, runtime, image, state, source,
                                     directory, cfg, progress, started)
        layout_dir = target.directory if target.oci and target.directory \
            else str(store.prepare(ref or ""))
        progress.step("compressing layers (zstd, in parallel)")
        built = image_build.build(client, directory, layout_dir, ref_name=tag_of(ref),
                                  level=cfg.image_zstd_level)
        sound_indexes.record(store.root, built.chunk_index)  # a basis for a next generation
        if recipients:
            progress.step(f"encrypting the layers for {len(recipients)} recipient(s)")
            built = encrypt_layout.encrypt_built(built, recipients, tag_of(ref))
    signing.own.record(cfg.image_store, built.index.digest)   # made here (torpor.signing.own)
    pushed = None
    if target.push and ref:
        progress.step(f"pushing {ref}")
        options = registry_options(cfg, ref, target.registry)
        result = push_layout(built.layout, ref, options=options,
                             mount_from=mount_from(metadata, ref))
        pushed = str(result.reference)
        signing.sign_with_node_key(ref, result.digest, target.sign or cfg.image_signing_key,
                                   options)
    return ImportResult(container.id, source, metadata.sizes,
                        {"total_s": time.monotonic() - started}, dropped, ref=ref,
                        layout=str(built.layout), digest=built.index.digest, pushed=pushed)


def _read_state(source: str) -> ContainerState:
    if not os.path.isdir(source):
        raise CheckpointError(f"no checkpoint {source}",
                              hint="give nerdctl's checkpoint name (with --data-root or "
                              "--checkpoint-dir if nerdctl had them) or its directory")
    if not os.path.exists(os.path.join(source, "inventory.img")):
        raise CheckpointError(f"{source} holds no CRIU images (no inventory.img)")
    try:
        state = container_state.read(source)
    except FormatError as e:
        raise CheckpointError(str(e)) from None
    if state is None:
        raise CheckpointError(
            f"{source} was not made under torpor-runc: it has CRIU's images but no torpor state",
            hint="run the container with `nerdctl run --runtime /path/to/torpor-runc` "
            "(the runtime name io.containerd.torpor.v2 does not work with nerdctl's checkpoints)")
    return state


def _lay_out(client: Client, container: containers_pb2.Container, runtime: RuntimeInfo,
             image: BaseImage | None, state: ContainerState, source: str, directory: str,
             cfg: Config, progress: Progress, started: float) -> tuple[CheckpointMetadata, int]:
    """Steps 3 to 5 into the empty directory `directory`."""
    criu_dir = os.path.join(directory, names.CRIU_DIR)
    progress.step("linking CRIU's images")
    _link_tree(source, criu_dir)
    # 3. the read-write layer beside the CRIU images
    diff = os.path.join(criu_dir, names.IMAGE_DIR_ROOTFS_DIFF)
    if os.path.exists(diff):
        os.replace(diff, os.path.join(directory, names.ROOTFS_DIFF))
    elif container.snapshot_key:
        progress.step(f"saving the read-write layer ({container.snapshotter} snapshotter)")
        snapshots.save_rw_layer(client, container, os.path.join(directory, names.ROOTFS_DIFF))
    # 4. a spec without nerdctl, and nerdctl's files saved like volumes
    spec, dropped = nerdctl.without_nerdctl_hooks(
        json.loads(container.spec.value) if container.spec.value else {})
    first = len(state.files.volumes)
    extra = [SavedVolume(first + i, f.destination, f.source, "file", f.read_only,
                         names.volume_archive(first + i))
             for i, f in enumerate(nerdctl.engine_files(spec))]
    if extra:
        for volume in extra:  # never write through a link into nerdctl's checkpoint
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(criu_dir, volume.archive))
        saved = tuple(saved_volumes.save(volume, criu_dir) for volume in extra)
        state = replace(state, files=replace(state.files,
                                             volumes=state.files.volumes + saved))
        container_state.write(criu_dir, state)  # a new file: nerdctl's is not touched
    # 5. checkpoint.json
    files = checkpoint_dir.inventory(directory)
    metadata = CheckpointMetadata(
        torpor_version=torpor.__version__,
        created=timestamps.now(),
        container=ContainerInfo(
            id=container.id, image=container.image, runtime=runtime, spec=spec,
            labels=dict(container.labels), snapshotter=container.snapshotter,
            snapshot_key=container.snapshot_key),
        image=image,
        request=CheckpointRequest(criu=state.criu, volumes=state.policy.volumes,
                                  dev_shm=state.policy.dev_shm, rootfs=state.policy.rootfs),
        node=runtime_tools.gather(client.address, runtime), state=state,
        sizes=Sizes(
            memory_pages=sum(f.size for f in files
                             if os.path.basename(f.path).startswith("pages-")),
            total=sum(f.size for f in files),
            rootfs_diff=next((f.size for f in files if f.path == names.ROOTFS_DIFF), 0)),
        timings={**state.timings, "import_s": time.monotonic() - started},
        files=files)
    checkpoint_dir.write_metadata(directory, metadata)
    return metadata, dropped


def _link_tree(source: str, target: str) -> None:
    """`source`'s files under `target` (0700), hard-linked where the filesystem allows, else
    copied; symlinks and other special files are refused, as in any checkpoint."""
    for root, dirs, files in os.walk(source):
        rel = os.path.relpath(root, source)
        os.makedirs(os.path.normpath(os.path.join(target, rel)), mode=0o700, exist_ok=True)
        for name in [*dirs, *files]:
            path = os.path.join(root, name)
            if os.path.islink(path) or not (os.path.isdir(path) or os.path.isfile(path)):
                raise CheckpointError(f"{path} is not a regular file or directory")
        for name in files:
            src, dst = os.path.join(root, name), os.path.normpath(os.path.join(target, rel, name))
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)


@contextmanager
def _fresh_directory(directory: str) -> Iterator[None]:
    """DIR new (0700) or empty; on failure, left as it was found."""
    created = output_path.prepare_dir(directory, "the checkpoint", CheckpointError)
    try:
        yield
    except BaseException:
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            for entry in os.listdir(directory):
                path = os.path.join(directory, entry)
                shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)
        raise
