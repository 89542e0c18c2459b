"""`torpor checkpoint CONTAINER`: one container, through containerd, into a checkpoint directory
(-o DIR), a checkpoint image in the local store (-t REF), pushed (--push), or an OCI layout
(-o DIR --oci).

Steps, in order (torpor-runc keeps the workload running if any of them fails before the dump):
 1. read the container and its task from containerd; refuse containers not run by torpor-runc;
 2. prepare the directory: DIR (new or empty), or scratch space in the local store for images;
 3. leave the request for torpor-runc in the state dir (CRIU images into DIR/criu, the file
    policy), because containerd forwards runc's options but no others;
 4. Tasks.Checkpoint under a lease, with CRIU's options; torpor-runc captures the network, GPU
    state and files, and runs `runc checkpoint`;
 5. lay the directory out: the read-write layer beside the CRIU images (or through containerd's
    diff service for other snapshotters), CRIU's log;
 6. write checkpoint.json (container, spec, image, request, node, state, sizes, timings);
 7. images only: compress the layers (zstd, in parallel) into an OCI layout, each layer
    uploaded as soon as it is written when pushing; with recipients, encrypt the image
    (image.encrypt_layout) before anything is uploaded (no early upload then);
 8. --push only: push the manifests.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torpor
from torpor.capture import records
from torpor.config import Config
from torpor.containerd import images as containerd_image
from torpor.containerd import runtime as runc_runtime
from torpor.containerd import snapshots
from torpor.containerd.api import containers_pb2
from torpor.containerd.api.task_pb2 import PAUSED, RUNNING
from torpor.containerd.client import Client
from torpor.errors import CheckpointError, NotFound
from torpor.formats import annotations as ann
from torpor.formats import names
from torpor.formats import state as container_state
from torpor.formats.files import Sizes
from torpor.formats.metadata import BaseImage, CheckpointMetadata, ContainerInfo, RuntimeInfo
from torpor.formats.request import CheckpointRequest
from torpor.image import build as image_build
from torpor.image import directory as checkpoint_dir
from torpor.image import encrypt_layout
from torpor.image.encryption_keys import Recipient
from torpor.image.store import Store
from torpor.node import facts as node
from torpor.ops.access import RegistryAccess
from torpor.ops.sources import mount_from, registry_options, tag_of
from torpor.registry import EarlyBlobs, push_layout
from torpor.reporting import SILENT, Progress


@dataclass(frozen=True)
class CheckpointTarget:
    """Where the checkpoint goes: a directory, a layout (`oci`), or an image `ref` (pushed)."""

    directory: str | None = None
    oci: bool = False
    ref: str | None = None
    push: bool = False
    registry: RegistryAccess = field(default_factory=RegistryAccess)
    recipients: tuple[Recipient, ...] = ()   # encrypt the image for these (jwe: public keys)


@dataclass(frozen=True)
class PushSummary:
    reference: str
    uploaded: int
    mounted: int
    existing: int
    bytes_uploaded: int


@dataclass(frozen=True)
class CheckpointResult:
    container: str
    stopped: bool                     # the container was stopped by the checkpoint
    sizes: Sizes
    timings: dict[str, float]
    directory: str | None = None      # a checkpoint directory
    ref: str | None = None            # an image in the local store
    layout: str | None = None         # where the image's OCI layout is
    digest: str | None = None         # the image index's digest
    raw_bytes: int = 0                # the checkpoint's files, uncompressed
    compressed_bytes: int = 0         # the image's new layers
    pushed: PushSummary | None = None

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("sizes", "pushed")}
        out["sizes"] = self.sizes.__dict__
        out["pushed"] = self.pushed.__dict__ if self.pushed else None
        return out


def checkpoint(client: Client, container_id: str, request: CheckpointRequest,
               target: CheckpointTarget, cfg: Config,
               progress: Progress = SILENT) -> CheckpointResult:
    started = time.monotonic()
    # 1. the container
    progress.step(f"reading container {container_id}")
    container = client.get_container(container_id)
    runtime = runc_runtime.require_torpor(container)
    try:
        task = client.get_task(container_id).process
    except NotFound:
        raise CheckpointError(f"container {container_id} has no running task to checkpoint") \
            from None
    if task.status not in (RUNNING, PAUSED):
        raise CheckpointError(f"the task of {container_id} is not running")
    image_name = container.image or _cri_image_name(container)
    image = containerd_image.image_chain(client, image_name) if image_name else None
    stopped = not request.criu.leave_running

    if target.ref is None and not target.oci:
        # 2-6. into DIR
        assert target.directory is not None
        directory = os.path.abspath(target.directory)
        with _fresh_directory(directory):
            metadata = _checkpoint_into(client, container, runtime, image, request, directory,
                                        cfg, progress, started)
        return CheckpointResult(container_id, stopped, metadata.sizes,
                                {**metadata.timings, "total_s": time.monotonic() - started},
                                directory=directory)

    # 2-6. into scratch space, then 7. the image and 8. the push
    store = Store(cfg.image_store)
    ref = target.ref
    push_options = registry_options(cfg, ref, target.registry) if target.push and ref else None
    with store.scratch() as scratch:
        directory = str(scratch / "checkpoint")
        os.makedirs(directory, mode=0o700)
        metadata = _checkpoint_into(client, container, runtime, image, request, directory, cfg,
                                    progress, started)
        layout_dir = target.directory if target.oci and target.directory \
            else str(store.prepare(ref or ""))
        t = time.monotonic()
        if push_options is not None and ref and not target.recipients:
            progress.step(f"compressing layers (zstd, in parallel) and pushing them to {ref}")
            with EarlyBlobs(ref, push_options, mount_from(metadata, ref)) as early:
                built = image_build.build(client, directory, layout_dir, ref_name=tag_of(ref),
                                          level=cfg.image_zstd_level, on_blob=early.submit)
        else:
            progress.step("compressing layers (zstd, in parallel)")
            built = image_build.build(client, directory, layout_dir, ref_name=tag_of(ref),
                                      level=cfg.image_zstd_level)
        if target.recipients:
            progress.step(f"encrypting the layers for {len(target.recipients)} recipient(s)")
            built = encrypt_layout.encrypt_built(built, target.recipients, tag_of(ref))
        timings = {**metadata.timings, "checkpoint_s": t - started,
                   "build_s": time.monotonic() - t}
    pushed = None
    if push_options is not None and ref:
        progress.step(f"pushing the manifests of {ref}")
        t = time.monotonic()
        result = push_layout(built.layout, ref, options=push_options,
                             mount_from=mount_from(metadata, ref))
        timings["push_s"] = time.monotonic() - t
        pushed = PushSummary(str(result.reference), result.uploaded, result.mounted,
                             result.existing, result.bytes_uploaded)
    timings["total_s"] = time.monotonic() - started
    return CheckpointResult(container_id, stopped, metadata.sizes, timings, ref=ref,
                            layout=str(built.layout), digest=built.index.digest,
                            raw_bytes=built.raw_bytes, compressed_bytes=built.compressed_bytes,
                            pushed=pushed)


@contextmanager
def _fresh_directory(directory: str) -> Iterator[None]:
    """DIR new (0700) or empty; on failure, left as it was found."""
    created = not os.path.exists(directory)
    if not created and (not os.path.isdir(directory) or os.listdir(directory)):
        raise CheckpointError(f"{directory} exists and is not an empty directory",
                              hint="pick a new -o DIR or remove it")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
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


def _checkpoint_into(client: Client, container: containers_pb2.Container, runtime: RuntimeInfo,
                     image: BaseImage | None, request: CheckpointRequest, directory: str,
                     cfg: Config, progress: Progress, started: float) -> CheckpointMetadata:
    """Steps 3 to 6 into the empty directory `directory`."""
    criu_dir = os.path.join(directory, names.CRIU_DIR)
    work_dir = os.path.join(directory, "work")
    record = records.containerd_record_dir(cfg.runtime_state_dir, client.namespace, container.id)
    os.makedirs(criu_dir, mode=0o700)
    try:
        # 3. the request for torpor-runc
        records.write_request(record, CheckpointRequest(
            criu=request.criu, volumes=request.volumes, dev_shm=request.dev_shm,
            rootfs=request.rootfs, image_path=criu_dir))
        # 4. Tasks.Checkpoint
        paths = {}
        if runc_runtime.passes_paths(runtime):
            os.makedirs(work_dir, mode=0o700)
            paths = {"image_path": criu_dir, "work_path": work_dir}
        progress.step("checkpointing the task (torpor-runc, CRIU)")
        t0 = time.monotonic()
        with client.lease():
            client.checkpoint_task(container.id,
                                   runc_runtime.checkpoint_options(request.criu, **paths))
        checkpoint_s = time.monotonic() - t0
    finally:
        records.take_request(record)  # never leave a request behind for a later checkpoint
    state = container_state.read(criu_dir)
    if state is None:
        raise CheckpointError(f"torpor-runc left no state in {criu_dir}: is the container's "
                              "runtime really torpor-runc?")
    # 5. the directory's layout
    _lay_out(directory, criu_dir, work_dir)
    if state.files.rootfs is None and container.snapshot_key:
        progress.step(f"saving the read-write layer ({container.snapshotter} snapshotter)")
        snapshots.save_rw_layer(client, container, os.path.join(directory, names.ROOTFS_DIFF))
    # 6. checkpoint.json
    progress.step("writing checkpoint metadata")
    checkpoint_dir.make_private(directory)
    files = checkpoint_dir.inventory(directory)
    metadata = CheckpointMetadata(
        torpor_version=torpor.__version__,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        container=ContainerInfo(
            id=container.id, image=container.image, runtime=runtime, spec=_spec_of(container),
            labels=dict(container.labels), snapshotter=container.snapshotter,
            snapshot_key=container.snapshot_key),
        image=image, request=request,
        node=node.gather(runc=node.low_level_runc(cfg.runtime_path)), state=state,
        sizes=Sizes(
            memory_pages=sum(f.size for f in files
                             if os.path.basename(f.path).startswith("pages-")),
            total=sum(f.size for f in files),
            rootfs_diff=next((f.size for f in files if f.path == names.ROOTFS_DIFF), 0)),
        timings={"checkpoint_s": checkpoint_s, "total_s": time.monotonic() - started},
        files=files)
    checkpoint_dir.write_metadata(directory, metadata)
    return metadata


def _lay_out(directory: str, criu_dir: str, work_dir: str) -> None:
    diff = os.path.join(criu_dir, names.IMAGE_DIR_ROOTFS_DIFF)
    if os.path.exists(diff):
        os.replace(diff, os.path.join(directory, names.ROOTFS_DIFF))
    if os.path.isdir(work_dir):
        log = os.path.join(work_dir, "dump.log")
        if os.path.exists(log):
            os.replace(log, os.path.join(directory, names.CRIU_DUMP_LOG))
        shutil.rmtree(work_dir, ignore_errors=True)


def _cri_image_name(container: containers_pb2.Container) -> str:
    """A Kubernetes pod's container names no image in containerd; its spec does."""
    annotations = _spec_of(container).get("annotations") or {}
    return str(annotations.get(ann.CRI_IMAGE_NAME) or "")


def _spec_of(container: containers_pb2.Container) -> dict[str, Any]:
    import json

    spec: dict[str, Any] = json.loads(container.spec.value) if container.spec.value else {}
    return spec
