"""Which of the node's GPUs a container can see: the GPUs a CUDA restore must map.

A process reaches a GPU through its device node /dev/nvidiaN, N being the GPU's minor number
(NVML's nvmlDeviceGetMinorNumber). The driver checkpoints the GPUs a process sees, those it
holds no memory on included, and a restore with GPU UUID pairs "must contain every
checkpointed GPU" (the Driver API reference, cuCheckpointProcessRestore). So a checkpoint
records every GPU whose device node the container has, and a restore maps each of them onto a
GPU the new container is given.

Where the device nodes are looked for; the first source that names any wins:
 1. the running container's own /dev (/proc/PID/root/dev/nvidiaN), whatever put them there
    (CDI, the NVIDIA container runtime or its hook, a bind mount): at checkpoint time;
 2. the spec: linux.devices, and mounts at /dev/nvidiaN (CDI and `--device` write these): what
    a container being restored will be given;
 3. NVIDIA_VISIBLE_DEVICES in the spec's environment ("all", or GPU indices or UUIDs), which
    the legacy NVIDIA hook turns into device nodes only when the container starts;
 4. otherwise every GPU of the node.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from torpor.formats.gpu import GpuDevice
from torpor.formats.oci import OciSpec

_NODE = re.compile(r"^/dev/nvidia(\d+)$")


@dataclass(frozen=True)
class ContainerGpus:
    gpus: tuple[GpuDevice, ...]   # the node's GPUs the container sees, in NVML index order
    source: str                   # where that was found, for messages
    unknown: tuple[str, ...] = ()  # device nodes or names that are no GPU of this node

    @property
    def partial(self) -> bool:
        """Fewer GPUs than the node has (partial passthrough)."""
        return self.source != "every GPU of the node"


def _minors_in_root(root: str) -> list[int]:
    try:
        names = os.listdir(os.path.join(root, "dev"))
    except OSError:
        return []
    minors = []
    for name in names:
        match = _NODE.match(f"/dev/{name}")
        if not match:
            continue
        try:
            info = os.stat(os.path.join(root, "dev", name))
        except OSError:
            continue
        minors.append(os.minor(info.st_rdev) if stat.S_ISCHR(info.st_mode)
                      else int(match.group(1)))
    return sorted(set(minors))


def _minors_in_spec(spec: OciSpec) -> list[int]:
    minors = []
    for device in (spec.get("linux") or {}).get("devices") or []:
        match = _NODE.match(str(device.get("path", "")))
        if match:
            minor = device.get("minor")
            minors.append(minor if isinstance(minor, int) else int(match.group(1)))
    for mount in spec.get("mounts") or []:
        match = _NODE.match(str(mount.get("destination", "")))
        if not match:
            continue
        try:
            info = os.stat(str(mount.get("source", "")))
            chardev = stat.S_ISCHR(info.st_mode)
        except OSError:
            chardev = False
        minors.append(os.minor(info.st_rdev) if chardev else int(match.group(1)))
    return sorted(set(minors))


def _visible_devices(spec: OciSpec) -> str | None:
    for entry in (spec.get("process") or {}).get("env") or []:
        if isinstance(entry, str) and entry.startswith("NVIDIA_VISIBLE_DEVICES="):
            return entry.split("=", 1)[1].strip()
    return None


def container_gpus(node_gpus: Sequence[GpuDevice], spec: OciSpec | None = None,
                   pid: int | None = None) -> ContainerGpus:
    """The GPUs of `node_gpus` the container sees (see the module docstring)."""
    by_minor = {g.minor_number: g for g in node_gpus if g.minor_number is not None}
    every = ContainerGpus(tuple(sorted(node_gpus, key=lambda g: g.index)),
                          "every GPU of the node")

    def of_minors(minors: list[int], source: str) -> ContainerGpus:
        found = sorted((by_minor[m] for m in minors if m in by_minor), key=lambda g: g.index)
        unknown = tuple(f"/dev/nvidia{m}" for m in minors if m not in by_minor)
        if len(found) == len(node_gpus) and not unknown:
            return every
        return ContainerGpus(tuple(found), source, unknown)

    if pid is not None:
        minors = _minors_in_root(f"/proc/{pid}/root")
        if minors:
            return of_minors(minors, "the container's /dev")
    if spec is not None:
        minors = _minors_in_spec(spec)
        if minors:
            return of_minors(minors, "the devices in the container's spec")
        names = _visible_devices(spec)
        if names and names not in ("all", "none", "void"):
            chosen, unknown = [], []
            for name in (n.strip() for n in names.split(",") if n.strip()):
                match = [g for g in node_gpus if g.uuid == name or str(g.index) == name]
                (chosen.extend(match) if match else unknown.append(name))
            if len(chosen) == len(node_gpus) and not unknown:
                return every
            return ContainerGpus(tuple(sorted(set(chosen), key=lambda g: g.index)),
                                 "NVIDIA_VISIBLE_DEVICES", tuple(unknown))
    return every
