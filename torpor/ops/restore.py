"""`torpor restore`: a container back from a local checkpoint directory, whole or not at all.

Steps (an ExitStack undoes each if a later one fails: no container, task or snapshot is left):
 1. check the directory against its checkpoint.json (every file, its size) and this node;
 2. the base image: present in containerd and unpacked for the snapshotter;
 3. a snapshot from the image plus the checkpoint's read-write layer (containerd's diff service);
 4. the container: the checkpoint's spec (cgroup path, network namespace and volume sources
    rewritten for the new name and node), runtime io.containerd.runc.v2 with BinaryName =
    this node's torpor-runc;
 5. the task from the CRIU images (criu_image_path), repeating BinaryName in the task options
    because containerd does not merge them with the container's; Tasks.Start runs
    torpor-runc restore, which puts back the CRIU flags, network, volumes and GPU state.
The checkpoint directory is only read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torpor.config import Config
from torpor.containerd import images as containerd_image
from torpor.containerd.api import containers_pb2, tasks_pb2, types_pb2
from torpor.containerd.client import SPEC_TYPE_URL, Client, pack_any, runc_options
from torpor.errors import AlreadyExists, NotFound, RestoreError
from torpor.image import directory as checkpoint_dir

Progress = Callable[[str], None]
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
ADD_ADDRESSES = "io.torpor.restore.add-addresses"
RESTORED_FROM = "io.torpor.restored-from"


@dataclass
class RestoreOptions:
    name: str | None = None
    netns: str | None = None              # restore into this network namespace (a path)
    add_addresses: bool = False           # add the addresses sockets need to that namespace
    volumes: dict[str, str] = field(default_factory=dict)   # destination -> new host source
    log_uri: str | None = None            # the task's stdout/stderr (default: a file)
    runtime_binary: str | None = None     # torpor-runc on this node


def default_runtime_binary() -> str:
    here = os.path.join(os.path.dirname(os.path.realpath(sys.argv[0])), "torpor-runc")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("torpor-runc")
    if not found:
        raise RestoreError("torpor-runc not found on this node", hint="pass --runtime-binary")
    return os.path.abspath(found)


def rewrite_spec(spec: dict[str, Any], old_id: str, new_id: str, namespace: str,
                 options: RestoreOptions) -> dict[str, Any]:
    spec = json.loads(json.dumps(spec))
    linux = spec.setdefault("linux", {})
    cgroups = linux.get("cgroupsPath")
    if cgroups and old_id != new_id:
        head, sep, tail = cgroups.rpartition(old_id)
        if sep and not tail.strip("/:"):
            linux["cgroupsPath"] = head + new_id + tail
    if options.netns:
        namespaces = linux.setdefault("namespaces", [])
        for ns in namespaces:
            if ns.get("type") == "network":
                ns["path"] = options.netns
                break
        else:
            namespaces.append({"type": "network", "path": options.netns})
    for mount in spec.get("mounts") or []:
        destination = str(mount.get("destination", "")).rstrip("/") or "/"
        if destination in options.volumes:
            mount["source"] = options.volumes[destination]
    annotations = spec.setdefault("annotations", {})
    if options.add_addresses:
        annotations[ADD_ADDRESSES] = "true"
    if spec.get("process", {}).get("terminal"):
        raise RestoreError("the checkpointed container has a terminal (tty): torpor restores "
                           "containers without one")
    return spec


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def apply_rootfs_diff(client: Client, path: str, mounts: list[types_pb2.Mount]) -> None:
    size = os.path.getsize(path)
    digest = _sha256_file(path)
    client.write_file(f"torpor-rootfs-{digest}", path, size, digest)
    client.apply_diff(types_pb2.Descriptor(media_type=LAYER_TAR, digest=digest, size=size), mounts)


def restore(client: Client, directory: str, options: RestoreOptions, cfg: Config,
            progress: Progress = lambda step: None,
            rootfs_image: dict[str, Any] | None = None) -> dict[str, Any]:
    """Restore from the checkpoint directory `directory`. `rootfs_image` (an image_chain) is an
    image in containerd that already holds the read-write layer (a checkpoint image's runnable
    manifest); without it, the base image plus the directory's rootfs-diff.tar are used."""
    started = time.time()
    directory = os.path.abspath(directory)
    progress(f"checking {directory}")
    metadata = checkpoint_dir.load(directory)
    original = metadata["container"]
    name = options.name or original["id"]
    try:
        client.get_container(name)
        raise AlreadyExists(f"container {name} already exists",
                            hint="restore under another --name, or delete it first")
    except NotFound:
        pass
    snapshotter = original.get("snapshotter") or "overlayfs"
    image = metadata.get("image")
    if not image:
        raise RestoreError("the checkpoint records no base image")
    if rootfs_image is not None:
        present, image = rootfs_image, rootfs_image
    else:
        progress(f"preparing the base image {image['name']}")
        try:
            present = containerd_image.image_chain(client, image["name"])
        except NotFound:
            raise RestoreError(f"the base image {image['name']} is not in containerd",
                               hint=f"pull it first (ctr images pull {image['name']})") from None
        if present["chain_id"] != image["chain_id"]:
            raise RestoreError(f"the image {image['name']} in containerd has other layers than "
                               f"the checkpoint's base ({image['manifest']['digest']})")
    spec = rewrite_spec(original["spec"], original["id"], name, client.namespace, options)
    binary = options.runtime_binary or default_runtime_binary()
    runtime = original.get("runtime") or {}
    work = os.path.join(cfg.runtime_state_dir, "restore-work",
                        f"{client.namespace}-{name}-{secrets.token_hex(3)}")
    log_uri = options.log_uri or _default_log_uri(cfg, client.namespace, name)
    with contextlib.ExitStack() as undo, client.lease():
        containerd_image.ensure_unpacked(client, snapshotter, present)
        progress("preparing the container's root filesystem")
        mounts = client.prepare_snapshot(snapshotter, name, image["chain_id"])
        undo.callback(_quietly, client.remove_snapshot, snapshotter, name)
        diff = os.path.join(directory, checkpoint_dir.ROOTFS_DIFF)
        if rootfs_image is None and os.path.exists(diff) and os.path.getsize(diff) > 0:
            apply_rootfs_diff(client, diff, mounts)
        common = {"binary_name": binary, "root": runtime.get("root", ""),
                  "systemd_cgroup": bool(runtime.get("systemd_cgroup"))}
        labels = dict(original.get("labels") or {})
        labels[RESTORED_FROM] = directory
        client.create_container(containers_pb2.Container(
            id=name, image=image["name"], labels=labels, snapshotter=snapshotter,
            snapshot_key=name,
            runtime=containers_pb2.Container.Runtime(name="io.containerd.runc.v2",
                                                     options=runc_options(**common)),
            spec=pack_any(SPEC_TYPE_URL, json.dumps(spec).encode())))
        undo.callback(_quietly, client.delete_container, name)
        os.makedirs(work, mode=0o700, exist_ok=True)
        undo.callback(shutil.rmtree, work, True)
        progress("restoring the task (torpor-runc, CRIU)")
        t0 = time.time()
        client.create_task(tasks_pb2.CreateTaskRequest(
            container_id=name, rootfs=mounts, stdout=log_uri, stderr=log_uri,
            options=runc_options(**common, criu_image_path=os.path.join(
                directory, checkpoint_dir.CRIU_DIR), criu_work_path=work)))
        undo.callback(_quietly, client.delete_task, name)
        try:
            pid = client.start_task(name)
        except Exception as e:
            kept = _keep_restore_log(cfg, client.namespace, name, work)
            raise RestoreError(f"restoring {name} failed: {e}",
                               hint=f"CRIU's log: {kept}" if kept else None) from None
        restore_s = time.time() - t0
        undo.pop_all()
    shutil.rmtree(work, ignore_errors=True)
    return {"name": name, "pid": pid, "namespace": client.namespace, "log": log_uri,
            "timings": {"restore_s": restore_s, "total_s": time.time() - started}}


def _default_log_uri(cfg: Config, namespace: str, name: str) -> str:
    directory = os.path.join(os.path.dirname(cfg.runtime_state_dir.rstrip("/")) or "/",
                             "torpor-logs") if cfg.runtime_state_dir != "/run/torpor" \
        else "/var/log/torpor"
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return f"file://{directory}/{namespace}-{name}.log"


def _keep_restore_log(cfg: Config, namespace: str, name: str, work: str) -> str | None:
    """Keep CRIU's restore log past the clean-up: it is where the real reason is."""
    log = os.path.join(work, "restore.log")
    if not os.path.exists(log):
        return None
    uri = _default_log_uri(cfg, namespace, name)
    kept = uri.removeprefix("file://").removesuffix(".log") + ".restore-failed.log"
    shutil.copyfile(log, kept)
    return kept


def _quietly(fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except Exception:
        pass
