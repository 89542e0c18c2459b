"""Bind-mounted volumes and /dev/shm: which to save, saving them, putting them back.

A volume is a bind mount from the spec whose source is a host file or directory the engine does
not regenerate. Policy, most specific first: the checkpoint request (`torpor checkpoint
--volumes`), the container annotation `io.torpor.checkpoint.volumes`, then the config
(`[checkpoint] volumes`). "all" saves every read-write volume, "none" saves none, and a list of
destinations saves exactly those (read-only ones included). A bind-mounted /dev/shm (Kubernetes
gives containers the pod's) is saved when `dev_shm` is on; an in-container tmpfs is CRIU's.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from torpor import archive
from torpor.errors import CheckpointError, RestoreError
from torpor.formats import names
from torpor.formats.files import SavedVolume, VolumePolicy
from torpor.formats.oci import OciSpec

# Destinations engines fill in themselves; never saved as volumes.
ENGINE_MANAGED = ("/etc/resolv.conf", "/etc/hosts", "/etc/hostname", "/dev/termination-log",
                  "/run/secrets", "/var/run/secrets", "/run/.containerenv")
SYSTEM_PREFIXES = ("/proc", "/sys", "/dev")


def is_bind(mount: dict[str, Any]) -> bool:
    options = mount.get("options") or []
    if not isinstance(options, list):
        options = []   # malformed: runc refuses the spec in words
    return mount.get("type") == "bind" or "bind" in options or "rbind" in options


def select(spec: OciSpec, policy: VolumePolicy,
           dev_shm: bool) -> tuple[list[SavedVolume], SavedVolume | None]:
    """The volumes to save under `policy`, and the bind-mounted /dev/shm if it is to be saved."""
    volumes: list[SavedVolume] = []
    shm: SavedVolume | None = None
    named = set(policy) if isinstance(policy, tuple) else set()
    for mount in spec.get("mounts") or []:
        if not is_bind(mount):
            continue
        destination = str(mount.get("destination", "")).rstrip("/") or "/"
        source = str(mount.get("source", ""))
        options = mount.get("options")
        read_only = isinstance(options, list) and "ro" in options
        if not source or not os.path.exists(source):
            continue
        kind = "dir" if os.path.isdir(source) else "file"
        if not (kind == "dir" or os.path.isfile(source)):
            continue  # device nodes and sockets are not data
        if destination == "/dev/shm":
            if dev_shm:
                shm = SavedVolume(-1, destination, source, kind, read_only, names.DEV_SHM_ARCHIVE)
            continue
        if destination in ENGINE_MANAGED or destination.startswith(SYSTEM_PREFIXES):
            continue
        wanted = destination in named if isinstance(policy, tuple) else (
            policy == "all" and not read_only)
        if wanted:
            index = len(volumes)
            volumes.append(SavedVolume(index, destination, source, kind, read_only,
                                       names.volume_archive(index)))
    missing = named - {v.destination for v in volumes}
    if missing:
        raise CheckpointError(f"no bind-mounted volume at {', '.join(sorted(missing))}",
                              hint="--volumes takes the destination paths inside the container")
    return volumes, shm


def save(volume: SavedVolume, image_path: str) -> SavedVolume:
    """Tar the volume's content into `image_path`; the volume with its byte count."""
    path = os.path.join(image_path, volume.archive)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        try:
            if volume.kind == "dir":
                size = archive.write_tree(volume.source, out)
            else:
                name = os.path.basename(volume.source)
                import tarfile

                with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                    st = os.lstat(volume.source)
                    with open(volume.source, "rb") as f:
                        tar.addfile(archive.tarinfo_for(name, st, volume.source), f)
                    size = st.st_size
        except OSError as e:
            raise CheckpointError(f"cannot save volume {volume.destination} "
                                  f"({volume.source}): {e}") from None
    return replace(volume, bytes=size)


def restore(volume: SavedVolume, image_path: str, source: str,
            limits: archive.ArchiveLimits | None = None, devices: bool = False,
            setid: bool = True) -> None:
    """Put a saved volume's content back at `source` (the restore-time bind source, which the
    restore policy allowed). Nothing is followed out of it; a file volume is staged in a private
    directory of unpredictable name beside it and renamed into place."""
    import shutil
    import tempfile

    name = volume.archive
    if os.path.basename(name) != name or not (
            name.startswith(names.VOLUME_ARCHIVE_PREFIX) or name == names.DEV_SHM_ARCHIVE):
        # the state travels in archives others made (kubelet's): never a path out of them
        raise RestoreError(f"the checkpoint names {volume.archive!r} as the archive of volume "
                           f"{volume.destination}: not a file name torpor writes")
    path = os.path.join(image_path, name)
    if not os.path.isfile(path) or os.path.islink(path):
        raise RestoreError(f"the checkpoint lacks {volume.archive} for volume {volume.destination}")
    if volume.kind == "dir":
        archive.extract(path, source, mode="volume", devices=devices, limits=limits, setid=setid)
        return
    if volume.kind != "file":
        raise RestoreError(f"volume {volume.destination} is of unknown kind {volume.kind!r}")
    staging = tempfile.mkdtemp(prefix=".torpor-restore-", dir=os.path.dirname(source) or "/")
    try:
        archive.extract(path, staging, mode="strict", limits=limits, setid=setid)
        entries = os.listdir(staging)
        if len(entries) != 1 or not os.path.isfile(os.path.join(staging, entries[0])):
            raise RestoreError(f"{volume.archive} should hold one file, not {len(entries)} entries")
        os.replace(os.path.join(staging, entries[0]), source)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
