"""The files a checkpoint saves besides CRIU's images: which ones, and saving them while the
container is frozen, so that they match the memory CRIU dumps.

The policy, most specific first: the checkpoint request (`torpor checkpoint --volumes`), the
container's annotation io.torpor.checkpoint.volumes, then the config (`[checkpoint]`). kubelet's
checkpoints leave the read-write layer to containerd, which archives it itself.
"""

from __future__ import annotations

import os

from torpor.archive import ArchiveLimits
from torpor.capture import pod, rootfs, volumes
from torpor.config import Config
from torpor.formats import annotations as ann
from torpor.formats import names
from torpor.formats.files import FilePolicy, SavedFiles, SavedRootfs, parse_volume_policy
from torpor.formats.oci import OciSpec
from torpor.formats.request import CheckpointRequest
from torpor.reporting import Log


def choose_policy(request: CheckpointRequest | None, spec: OciSpec, cfg: Config,
                  in_pod: bool = False) -> FilePolicy:
    spec_annotations = spec.get("annotations") or {}
    chosen = ((request.volumes if request else None)
              or parse_volume_policy(spec_annotations.get(ann.CHECKPOINT_VOLUMES))
              or parse_volume_policy(cfg.checkpoint_volumes) or "all")
    dev_shm = request.dev_shm if request and request.dev_shm is not None else cfg.checkpoint_dev_shm
    keep_rootfs = request.rootfs if request and request.rootfs is not None else (
        cfg.checkpoint_rootfs and not in_pod)
    return FilePolicy(volumes=chosen, dev_shm=dev_shm, rootfs=keep_rootfs)


def save(pid: int, spec: OciSpec, policy: FilePolicy, image_path: str, log: Log) -> SavedFiles:
    """The read-write layer (overlay upperdir, as an OCI layer), the volumes and a bind-mounted
    /dev/shm, as flat files into `image_path` (names.STATE_PREFIX); call with the container
    frozen."""
    saved_rootfs = None
    if policy.rootfs:
        overlay = rootfs.root_overlay(pid)
        if overlay is None:
            log.info("the container's root is not an overlay mount: its read-write layer is "
                     "left to containerd's diff service")
        else:
            path = os.path.join(image_path, names.IMAGE_DIR_ROOTFS_DIFF)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as out:
                entries = rootfs.write_layer(overlay["upperdir"], out)
                saved_rootfs = SavedRootfs(names.ROOTFS_DIFF, entries, out.tell())
    selected, shm = volumes.select(spec, policy.volumes, policy.dev_shm)
    saved = tuple(volumes.save(volume, image_path) for volume in selected)
    return SavedFiles(rootfs=saved_rootfs, volumes=saved,
                      dev_shm=volumes.save(shm, image_path) if shm is not None else None)


def restore(spec: OciSpec, bundle: str, image_path: str, files: SavedFiles,
            limits: ArchiveLimits | None = None, devices: bool = False,
            engine_made: bool = False, mount_sources: tuple[str, ...] = ()) -> None:
    """The read-write layer (when it travelled in the image directory, as with ctr), the
    volumes and /dev/shm, into the restore-time rootfs and bind sources. The caller has checked
    the spec against the restore policy (its root is the bundle's rootfs).

    `engine_made`: the spec is the one the engine made for the new container (a Kubernetes
    restore, a restore on create), so its bind sources were chosen by whoever wrote the pod or
    ran the container, not checked by the policy. Then a saved volume is never written into a
    read-only mount, nor with setuid or setgid bits; and in a pod (kubelet's spec, whose
    hostPath volumes the pod's author picks) only into what kubelet and containerd made for
    this pod (emptyDir volumes, the sandbox's /dev/shm) or a source under `[restore]
    mount_sources` (`mount_sources`)."""
    from torpor import archive
    from torpor.errors import RestoreError

    diff = os.path.join(image_path, names.IMAGE_DIR_ROOTFS_DIFF)
    root = (spec.get("root") or {}).get("path") or "rootfs"
    # a root elsewhere passed the policy only as the node's own engine's (Podman's storage):
    # that engine keeps the container's read-write layer itself (and brings its own diff back
    # with `podman container restore --import`); torpor's copy is not written over it
    if files.rootfs and os.path.exists(diff) and root == "rootfs":
        archive.extract(diff, os.path.join(bundle, root), mode="layer", devices=devices,
                        limits=limits)
    mounts = {str(m.get("destination", "")).rstrip("/") or "/": m
              for m in spec.get("mounts") or [] if volumes.is_bind(m)}
    saved = [*files.volumes, *([files.dev_shm] if files.dev_shm else [])]
    in_pod = pod.in_pod(spec)
    for volume in saved:
        mount = mounts.get(volume.destination)
        source = str(mount.get("source") or "") if mount else ""
        if not source:
            raise RestoreError(f"the checkpoint saved volume {volume.destination}, but the "
                               "restore-time spec has no bind mount there")
        if engine_made:
            refuse_engine_source(volume.destination, source, mount or {}, in_pod, mount_sources)
        volumes.restore(volume, image_path, source, limits, devices, setid=not engine_made)


def refuse_engine_source(destination: str, source: str, mount: dict[str, object], in_pod: bool,
                         mount_sources: tuple[str, ...]) -> None:
    """RestoreError unless a saved volume may be written at `source` of a spec the engine made
    (see restore)."""
    from torpor.capture.restore_policy import under
    from torpor.errors import RestoreError

    options = mount.get("options")
    if isinstance(options, list) and "ro" in options:
        raise RestoreError(f"the checkpoint saved volume {destination}, but the new container "
                           f"mounts it read-only (from {source}): torpor does not write there",
                           hint="mount it read-write, or start the container cold")
    if in_pod and not (pod.made_for_pod(source) or under(source, mount_sources)):
        raise RestoreError(f"the checkpoint saved volume {destination}, but the pod mounts "
                           f"{source} there, which neither kubelet made for the pod (emptyDir, "
                           "/dev/shm) nor [restore] mount_sources names: torpor does not write "
                           "the checkpoint's files into a host path a pod chose",
                           hint="use an emptyDir for it, or name the path in [restore] "
                                "mount_sources")
