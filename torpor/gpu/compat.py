"""Can this node's GPUs take a checkpoint's GPU state? Every reason it cannot, in words.

Both sides are inventories (inventory.py): `recorded` at checkpoint time, `current` here. The
GPUs that matter are those the checkpointed processes used (all recorded GPUs when NVML listed
none). Each maps to a GPU here: to the same UUID when every one of them is present (identity,
restored without GPU pairs, as NVIDIA's own tooling does), else to the GPU at the same index
(restored with old->new UUID pairs, which needs driver r580). A mapped GPU must be the same
model (name, architecture, compute capability), have persistence mode on and MIG off, and have
as much free memory as the processes used on it: a CUDA restore that runs out of GPU memory
leaves the process unrestorable for good. The driver version must be identical (the restored
process keeps the driver's user-space libraries it had mapped).
"""

from __future__ import annotations

from torpor.errors import IncompatibleNode
from torpor.formats.gpu import GpuDevice, GpuInventory
from torpor.gpu.cuda import UUID_REMAP_MIN_DRIVER, format_version
from torpor.gpu.inventory import gib


def used_gpus(recorded: GpuInventory) -> list[GpuDevice]:
    """The recorded GPUs the checkpointed processes ran on (all of them when unknown)."""
    used = {p.gpu_uuid for p in recorded.processes}
    gpus = [g for g in recorded.gpus if g.uuid in used]
    return gpus or list(recorded.gpus)


def needed_memory(recorded: GpuInventory) -> dict[str, int]:
    """Bytes the checkpointed processes held, per recorded GPU UUID."""
    needed: dict[str, int] = {}
    for p in recorded.processes:
        needed[p.gpu_uuid] = needed.get(p.gpu_uuid, 0) + p.used_memory
    return needed


def is_identity(recorded: GpuInventory, current: GpuInventory) -> bool:
    here = {g.uuid for g in current.gpus}
    return all(g.uuid in here for g in used_gpus(recorded))


def targets(recorded: GpuInventory,
            current: GpuInventory) -> list[tuple[GpuDevice, GpuDevice | None]]:
    """(recorded GPU, the GPU here it restores onto, None when there is none) for each used GPU."""
    gpus = list(current.gpus)
    if is_identity(recorded, current):
        by_uuid = {g.uuid: g for g in gpus}
        return [(g, by_uuid[g.uuid]) for g in used_gpus(recorded)]
    return [(g, gpus[g.index] if g.index < len(gpus) else None) for g in used_gpus(recorded)]


def memory_shortfalls(recorded: GpuInventory, current: GpuInventory) -> list[str]:
    """GPUs here without room for what the checkpointed processes used on them."""
    needed = needed_memory(recorded)
    out = []
    for old, new in targets(recorded, current):
        need = needed.get(old.uuid, 0)
        if new is not None and need > new.memory_free:
            out.append(f"GPU {new.index} ({new.uuid}) has {gib(new.memory_free)} free; "
                       f"the checkpointed processes need {gib(need)} on it: free GPU memory "
                       "(stop other work on it) or restore on another node")
    return out


def _count_refusal(recorded: GpuInventory, current: GpuInventory) -> str | None:
    used, here = used_gpus(recorded), current.gpus
    if not used or max(g.index for g in used) < len(here):
        return None
    return (f"the checkpoint needs {max(g.index for g in used) + 1} GPU(s) "
            f"({', '.join(g.model for g in used)}); this node has {len(here)}")


def _remap_refusal(recorded: GpuInventory, current: GpuInventory) -> str | None:
    version = current.cuda_driver_version
    if is_identity(recorded, current) or version >= UUID_REMAP_MIN_DRIVER:
        return None
    here = {g.uuid for g in current.gpus}
    missing = [g.uuid for g in used_gpus(recorded) if g.uuid not in here]
    return (f"the checkpoint's GPUs {', '.join(missing)} are not on this node, and restoring "
            "onto other GPUs needs driver 580 (CUDA 13.0) or newer; this node has "
            f"{current.driver_version} (CUDA {format_version(version)})")


def mismatches(recorded: GpuInventory | None, current: GpuInventory | None) -> list[str]:
    """Every reason this node cannot restore the recorded GPU state; empty when it can."""
    if recorded is None:
        return []  # no inventory was recorded (NVML was missing): nothing to compare
    if current is None:
        return ["the checkpoint holds GPU state, but this node has no NVIDIA driver (NVML "
                "cannot be loaded): restore on a node with NVIDIA GPUs"]
    out = [m for m in (_count_refusal(recorded, current),) if m]
    if recorded.driver_version != current.driver_version:
        out.append(f"this node has NVIDIA driver {current.driver_version}; the "
                   f"checkpoint was taken with {recorded.driver_version}: install the "
                   "same driver version")
    for old, new in targets(recorded, current):
        if new is None:
            continue
        where = f"GPU {new.index}"
        if (new.name, new.architecture, new.compute_capability) != (
                old.name, old.architecture, old.compute_capability):
            out.append(f"{where} is a {new.model}; the checkpoint needs a {old.model}")
        if not new.persistence_mode:
            out.append(f"{where} has persistence mode off: enable it (`nvidia-smi -i "
                       f"{new.index} -pm 1`, or run nvidia-persistenced)")
        if new.mig_mode == "on":
            out.append(f"{where} has MIG enabled, which CUDA checkpoints do not support: "
                       f"disable it (`nvidia-smi -i {new.index} -mig 0`)")
    out.extend(memory_shortfalls(recorded, current))
    out.extend(m for m in (_remap_refusal(recorded, current),) if m)
    return out


def uuid_pairs(recorded: GpuInventory | None,
               current: GpuInventory | None) -> list[tuple[str, str]] | None:
    """None when the checkpoint's GPUs are all here (no pairs: the driver's default path), else
    (old UUID, new UUID) for every recorded GPU, by index. IncompatibleNode when pairs would be
    needed on a driver older than r580, or a used GPU has no counterpart here."""
    if recorded is None or current is None or is_identity(recorded, current):
        return None
    refusals = [m for m in (_count_refusal(recorded, current),
                            _remap_refusal(recorded, current)) if m]
    if refusals:
        raise IncompatibleNode(refusals)
    here = current.gpus
    return [(g.uuid, here[g.index].uuid) for g in recorded.gpus if g.index < len(here)]
