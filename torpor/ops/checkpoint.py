"""`torpor checkpoint`: one container, through containerd, into a local checkpoint directory.

Steps (each undone if a later one fails; torpor-runc keeps the workload running meanwhile):
 1. read the container and its task from containerd; refuse containers not run by torpor-runc;
 2. leave the options for torpor-runc in the state dir (CRIU images into DIR/criu, volumes
    policy), because containerd forwards runc's options but no others;
 3. Tasks.Checkpoint under a lease, with runc's checkpoint options; torpor-runc captures the
    network, GPU state and files, and runs `runc checkpoint`;
 4. move the read-write layer beside the CRIU images, list every file with its size, and write
    checkpoint.json (container, spec, image, options, node, state, sizes, timings).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torpor
from torpor.capture import records
from torpor.config import Config
from torpor.containerd import images as containerd_image
from torpor.containerd.api import containers_pb2, runc_options_pb2
from torpor.containerd.api.task_pb2 import PAUSED, RUNNING
from torpor.containerd.client import Client, decode_runc_options
from torpor.errors import CheckpointError, NotFound
from torpor.image import directory as checkpoint_dir
from torpor.node import facts as node
from torpor.shim import image_dir

Progress = Callable[[str], None]
TORPOR_SHIM = "io.containerd.torpor.v2"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"


@dataclass
class CheckpointOptions:
    leave_running: bool = False
    tcp_established: bool = False
    file_locks: bool = False
    ext_unix_sk: bool = False
    shell_job: bool = False
    volumes: str | list[str] | None = None   # None: the container's annotation, else the config
    dev_shm: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def runtime_of(container: containers_pb2.Container) -> dict[str, Any]:
    options = decode_runc_options(container.runtime.options)
    return {"name": container.runtime.name, "binary_name": options.binary_name,
            "root": options.root, "systemd_cgroup": options.systemd_cgroup}


def check_torpor_runtime(container: containers_pb2.Container) -> dict[str, Any]:
    runtime = runtime_of(container)
    if runtime["name"] == TORPOR_SHIM or "torpor" in os.path.basename(runtime["binary_name"]):
        return runtime
    binary = runtime["binary_name"] or "runc"
    raise CheckpointError(
        f"container {container.id} runs under {runtime['name']} with {binary}, not torpor-runc",
        hint="create it with --runtime io.containerd.torpor.v2 or the torpor runtime class")


def runc_named(runtime_name: str) -> bool:
    """containerd passes image and work paths only to runtimes named io.containerd.runc.*."""
    return runtime_name.split(".")[:3] == ["io", "containerd", "runc"]


def _prepare_directory(directory: str) -> bool:
    """Create DIR (0700); refuse a non-empty one. True when we created it."""
    if os.path.exists(directory):
        if not os.path.isdir(directory) or os.listdir(directory):
            raise CheckpointError(f"{directory} exists and is not an empty directory",
                                  hint="pick a new -o DIR or remove it")
        os.chmod(directory, 0o700)
        return False
    os.makedirs(directory, mode=0o700)
    return True


def checkpoint(client: Client, container_id: str, directory: str, options: CheckpointOptions,
               cfg: Config, progress: Progress = lambda step: None) -> dict[str, Any]:
    started = time.time()
    directory = os.path.abspath(directory)
    progress(f"reading container {container_id}")
    container = client.get_container(container_id)
    runtime = check_torpor_runtime(container)
    try:
        task = client.get_task(container_id).process
    except NotFound:
        raise CheckpointError(f"container {container_id} has no running task to checkpoint") \
            from None
    if task.status not in (RUNNING, PAUSED):
        raise CheckpointError(f"the task of {container_id} is not running")
    image = containerd_image.image_chain(client, container.image) if container.image else None
    created = _prepare_directory(directory)
    criu_dir = os.path.join(directory, checkpoint_dir.CRIU_DIR)
    work_dir = os.path.join(directory, "work")
    record = records.containerd_record_dir(cfg.runtime_state_dir, client.namespace, container_id)
    try:
        os.makedirs(criu_dir, mode=0o700)
        request = {"image_path": criu_dir, "volumes": options.volumes, "dev_shm": options.dev_shm}
        records.write_request(record, {k: v for k, v in request.items() if v is not None})
        ck = runc_options_pb2.CheckpointOptions(
            exit=not options.leave_running, open_tcp=options.tcp_established,
            external_unix_sockets=options.ext_unix_sk, terminal=options.shell_job,
            file_locks=options.file_locks)
        if runc_named(runtime["name"]):
            os.makedirs(work_dir, mode=0o700)
            ck.image_path, ck.work_path = criu_dir, work_dir
        progress("checkpointing the task (torpor-runc, CRIU)")
        t0 = time.time()
        with client.lease():
            client.checkpoint_task(container_id, ck)
        checkpoint_s = time.time() - t0
        state = image_dir.read_state(criu_dir)
        if state is None:
            raise CheckpointError(f"torpor-runc left no state in {criu_dir}: is the container's "
                                  "runtime really torpor-runc?")
        _finish_layout(directory, criu_dir, work_dir)
        if not (state.get("files") or {}).get("rootfs") and container.snapshot_key:
            progress(f"saving the read-write layer ({container.snapshotter} snapshotter)")
            rootfs_by_diff_service(client, container,
                                   os.path.join(directory, checkpoint_dir.ROOTFS_DIFF))
        progress("writing checkpoint metadata")
        metadata = _metadata(container, runtime, image, options, state, directory,
                             timings={"checkpoint_s": checkpoint_s,
                                      "total_s": time.time() - started})
        checkpoint_dir.write_metadata(directory, metadata)
        return metadata
    except BaseException:
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            for entry in os.listdir(directory):
                path = os.path.join(directory, entry)
                shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)
        raise
    finally:
        records.take_request(record)  # never leave a request behind for a later checkpoint


def rootfs_by_diff_service(client: Client, container: containers_pb2.Container,
                           out_path: str) -> None:
    """The read-write layer from containerd's diff service, for snapshotters that are not
    overlay (torpor-runc saves overlay upper directories itself, while the container is frozen;
    this runs after the checkpoint)."""
    snapshotter, key = container.snapshotter, container.snapshot_key
    parent = client.stat_snapshot(snapshotter, key).parent
    view = f"torpor-diff-{container.id}-{secrets.token_hex(4)}"
    with client.lease():
        left = client.view_snapshot(snapshotter, view, parent)
        try:
            right = client.snapshot_mounts(snapshotter, key)
            layer = client.diff(left, right, LAYER_TAR, f"torpor-rootfs-{container.id}")
        finally:
            client.remove_snapshot(snapshotter, view)
        fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            for chunk in client.read_content(layer.digest):
                out.write(chunk)


def _finish_layout(directory: str, criu_dir: str, work_dir: str) -> None:
    diff = os.path.join(image_dir.state_dir(criu_dir), image_dir.ROOTFS_DIFF)
    if os.path.exists(diff):
        os.replace(diff, os.path.join(directory, checkpoint_dir.ROOTFS_DIFF))
    if os.path.isdir(work_dir):
        log = os.path.join(work_dir, "dump.log")
        if os.path.exists(log):
            os.replace(log, os.path.join(directory, "criu-dump.log"))
        shutil.rmtree(work_dir, ignore_errors=True)


def _metadata(container: containers_pb2.Container, runtime: dict[str, Any],
              image: dict[str, Any] | None, options: CheckpointOptions, state: dict[str, Any],
              directory: str, timings: dict[str, float]) -> dict[str, Any]:
    spec = json.loads(container.spec.value) if container.spec.value else {}
    files = checkpoint_dir.inventory(directory)
    pages = sum(f["size"] for f in files if os.path.basename(f["path"]).startswith("pages-"))
    return {
        "format": checkpoint_dir.FORMAT,
        "torpor_version": torpor.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "container": {
            "id": container.id, "image": container.image, "labels": dict(container.labels),
            "snapshotter": container.snapshotter, "snapshot_key": container.snapshot_key,
            "runtime": runtime, "spec": spec,
        },
        "image": image,
        "options": {k: v for k, v in asdict(options).items() if k != "extra"},
        "node": node.gather().to_dict(),
        "state": {k: state.get(k) for k in ("criu_flags", "network", "files", "gpu", "policy",
                                            "timings", "init_pid", "processes")},
        "sizes": {"memory_pages": pages, "total": sum(f["size"] for f in files),
                  "rootfs_diff": next((f["size"] for f in files
                                       if f["path"] == checkpoint_dir.ROOTFS_DIFF), 0)},
        "timings": timings,
        "files": files,
    }

