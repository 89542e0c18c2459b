"""Steps 3 to 6 of `torpor checkpoint` (torpor.ops.checkpoint): the dump, into a checkpoint
directory. The request goes into the checkpoint's journal; Tasks.Checkpoint runs until CRIU's
images are complete (torpor.ops.transaction); then the directory is laid out and
checkpoint.json, written last, makes it whole."""

from __future__ import annotations

import os
import shutil
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torpor
from torpor.containerd import runtime as runc_runtime
from torpor.containerd import snapshots
from torpor.containerd.api import containers_pb2
from torpor.formats import names, timestamps
from torpor.formats.files import Sizes
from torpor.formats.metadata import BaseImage, CheckpointMetadata, ContainerInfo, RuntimeInfo
from torpor.formats.request import CheckpointRequest
from torpor.image import directory as checkpoint_dir
from torpor.node import runtime as runtime_tools
from torpor.ops.transaction import RUNTIME_SLACK_S, Transaction
from torpor.reporting import Progress

REQUEST_TTL_S = 300


@dataclass(frozen=True)
class CheckpointedContainer:
    """The container as read at step 1."""

    record: containers_pb2.Container
    runtime: RuntimeInfo
    image: BaseImage | None
    pid: int = 0   # its task's init, as read then


def checkpoint_into(txn: Transaction, container: CheckpointedContainer, request: CheckpointRequest,
                     directory: str, progress: Progress, started: float,
                     kept: bool = False,
                     beside_dump: AbstractContextManager[object] | None = None
                     ) -> CheckpointMetadata:
    """Steps 3 to 6 into the empty directory `directory`; `kept`: it is the checkpoint itself
    (-o DIR), synced next, so torpor-runc has CRIU's images written to disk as CRIU dumps;
    `beside_dump` is entered for as long as the dump runs (an image's DumpFollower)."""
    record = container.record
    node = runtime_tools.gather_ahead(txn.client.address, container.runtime)   # for step 6
    criu_dir = os.path.join(directory, names.CRIU_DIR)
    os.makedirs(criu_dir, mode=0o700)
    # 3. the request for torpor-runc
    txn.journal.write_request(CheckpointRequest(
        criu=request.criu, volumes=request.volumes, dev_shm=request.dev_shm,
        rootfs=request.rootfs, image_path=criu_dir, expires=time.time() + REQUEST_TTL_S,
        keep_images=kept))
    txn.step("requested")
    # 4. Tasks.Checkpoint: every runtime gets the work path, runc.* ones the image path too
    paths = {"work_path": txn.journal.work_dir}
    if runc_runtime.passes_paths(container.runtime):
        paths["image_path"] = criu_dir
    options = runc_runtime.checkpoint_options(request.criu, **paths)
    progress.step("checkpointing the task (torpor-runc, CRIU)")
    t0 = time.monotonic()
    with beside_dump or nullcontext():
        txn.dump(lambda: txn.client.checkpoint_task(record.id, options), criu_dir,
                 dump_deadline(txn, container.pid))
    checkpoint_s = time.monotonic() - t0
    state = txn.state(criu_dir)
    # 5. the directory's layout
    txn.step("writing")
    _lay_out(directory, criu_dir, txn.journal.work_dir)
    if state.files.rootfs is None and record.snapshot_key:
        progress.step(f"saving the read-write layer ({record.snapshotter} snapshotter)")
        snapshots.save_rw_layer(txn.client, record, os.path.join(directory, names.ROOTFS_DIFF))
    # 6. checkpoint.json, last: its presence means the directory is whole
    progress.step("writing checkpoint metadata")
    checkpoint_dir.make_private(directory)
    files = checkpoint_dir.inventory(directory)
    metadata = CheckpointMetadata(
        torpor_version=torpor.__version__,
        created=timestamps.now(),
        container=ContainerInfo(
            id=record.id, image=record.image, runtime=container.runtime, spec=_spec_of(record),
            labels=dict(record.labels), snapshotter=record.snapshotter,
            snapshot_key=record.snapshot_key),
        image=container.image, request=request,
        node=node.result(), state=state,
        sizes=Sizes(
            memory_pages=sum(f.size for f in files
                             if os.path.basename(f.path).startswith("pages-")),
            total=sum(f.size for f in files),
            rootfs_diff=next((f.size for f in files if f.path == names.ROOTFS_DIFF), 0)),
        timings={"checkpoint_s": checkpoint_s, "total_s": time.monotonic() - started},
        files=files)
    checkpoint_dir.write_metadata(directory, metadata)
    return metadata


def dump_deadline(txn: Transaction, pid: int) -> float | None:
    """How long Tasks.Checkpoint may take to dump: `[checkpoint] timeout_s` plus 10 s per GiB
    of the memory of the container whose init is `pid`, as torpor-runc reckons it, plus
    RUNTIME_SLACK_S."""
    from torpor.capture import deadlines

    if txn.cfg.checkpoint_timeout_s <= 0:
        return None
    return deadlines.budget(txn.cfg.checkpoint_timeout_s, deadlines.memory_bytes(pid)) \
        + RUNTIME_SLACK_S


def _lay_out(directory: str, criu_dir: str, work_dir: str) -> None:
    """The read-write layer out of torpor-runc's state, and a copy of CRIU's log as it stands
    (CRIU may still write to it: it holds the container until the commit)."""
    diff = os.path.join(criu_dir, names.IMAGE_DIR_ROOTFS_DIFF)
    if os.path.exists(diff):
        os.replace(diff, os.path.join(directory, names.ROOTFS_DIFF))
    log = os.path.join(work_dir, "dump.log")
    if os.path.exists(log):
        shutil.copyfile(log, os.path.join(directory, names.CRIU_DUMP_LOG))
        os.chmod(os.path.join(directory, names.CRIU_DUMP_LOG), 0o600)


def _spec_of(container: containers_pb2.Container) -> dict[str, Any]:
    import json

    spec: dict[str, Any] = json.loads(container.spec.value) if container.spec.value else {}
    return spec
