"""Can this node's GPUs take a checkpoint's GPU state? Every reason it cannot, in words.

`recorded` is the inventory taken at checkpoint time, `visible` the UUIDs of the GPUs the
container could see then (GpuState.visible_gpus), `current` this node's inventory and `given`
the GPUs of this node the restored container is given (visibility.py; None: all of them).

The GPUs a restore must map are every GPU the container could see, with those its processes
held memory on: the driver checkpoints every GPU a process sees, and GPU UUID pairs "must
contain every checkpointed GPU" (the Driver API reference). Each maps to a GPU given here: to
the same UUID when every one of them is given (identity, restored without GPU pairs, as
NVIDIA's own tooling does), else to the given GPUs in index order (restored with old->new UUID
pairs, which needs driver r580). A mapped GPU must be the same model (name, architecture,
compute capability), have MIG off, and have as much free memory as the processes used on it:
a CUDA restore that runs out of GPU memory leaves the process unrestorable for good
(cuda-checkpoint issue 44). The driver version must be identical (the restored process keeps
the driver's user-space libraries it had mapped). Persistence mode is not required: torpor
calls cuInit before a restore, which the reference accepts instead.
"""

from __future__ import annotations

from torpor.errors import IncompatibleNode
from torpor.formats.gpu import GpuDevice, GpuInventory
from torpor.gpu.cuda import UUID_REMAP_MIN_DRIVER, format_version
from torpor.gpu.inventory import gib, partial_passthrough_broken
from torpor.gpu.visibility import ContainerGpus


def needed_gpus(recorded: GpuInventory, visible: tuple[str, ...] = ()) -> list[GpuDevice]:
    """The recorded GPUs a restore must map, in index order: every GPU the container could
    see and every GPU its processes held memory on (every recorded GPU when `visible` was not
    recorded)."""
    if not visible:
        return sorted(recorded.gpus, key=lambda g: g.index)
    wanted = set(visible) | {p.gpu_uuid for p in recorded.processes}
    return sorted((g for g in recorded.gpus if g.uuid in wanted), key=lambda g: g.index)


def needed_memory(recorded: GpuInventory) -> dict[str, int]:
    """Bytes the checkpointed processes held, per recorded GPU UUID."""
    needed: dict[str, int] = {}
    for p in recorded.processes:
        needed[p.gpu_uuid] = needed.get(p.gpu_uuid, 0) + p.used_memory
    return needed


def _targets(current: GpuInventory, given: ContainerGpus | None) -> list[GpuDevice]:
    gpus = given.gpus if given is not None else current.gpus
    return sorted(gpus, key=lambda g: g.index)


def is_identity(recorded: GpuInventory, current: GpuInventory, visible: tuple[str, ...] = (),
                given: ContainerGpus | None = None) -> bool:
    here = {g.uuid for g in _targets(current, given)}
    return all(g.uuid in here for g in needed_gpus(recorded, visible))


def mapping(recorded: GpuInventory, current: GpuInventory, visible: tuple[str, ...] = (),
            given: ContainerGpus | None = None) -> list[tuple[GpuDevice, GpuDevice | None]]:
    """(recorded GPU, the GPU here it restores onto, None when there is none), for each."""
    targets = _targets(current, given)
    needed = needed_gpus(recorded, visible)
    if is_identity(recorded, current, visible, given):
        by_uuid = {g.uuid: g for g in targets}
        return [(g, by_uuid[g.uuid]) for g in needed]
    return [(g, targets[i] if i < len(targets) else None) for i, g in enumerate(needed)]


def memory_shortfalls(recorded: GpuInventory, current: GpuInventory,
                      visible: tuple[str, ...] = (),
                      given: ContainerGpus | None = None) -> list[str]:
    """GPUs here without room for what the checkpointed processes used on them."""
    needed = needed_memory(recorded)
    out = []
    for old, new in mapping(recorded, current, visible, given):
        need = needed.get(old.uuid, 0)
        if new is not None and need > new.memory_free:
            out.append(f"GPU {new.index} ({new.uuid}) has {gib(new.memory_free)} free; "
                       f"the checkpointed processes need {gib(need)} on it: free GPU memory "
                       "(stop other work on it) or restore on another node")
    return out


def _count_refusal(recorded: GpuInventory, current: GpuInventory, visible: tuple[str, ...],
                   given: ContainerGpus | None) -> str | None:
    needed, targets = needed_gpus(recorded, visible), _targets(current, given)
    if len(needed) <= len(targets) or is_identity(recorded, current, visible, given):
        return None
    where = (f"this container is given {len(targets)} ({given.source})"
             if given is not None and given.partial else f"this node has {len(targets)}")
    return (f"the checkpoint's processes could see {len(needed)} GPU(s) "
            f"({', '.join(g.model for g in needed)}) and each must be restored onto one; "
            f"{where}")


def _remap_refusal(recorded: GpuInventory, current: GpuInventory, visible: tuple[str, ...],
                   given: ContainerGpus | None) -> str | None:
    version = current.cuda_driver_version
    if is_identity(recorded, current, visible, given) or version >= UUID_REMAP_MIN_DRIVER:
        return None
    here = {g.uuid for g in _targets(current, given)}
    missing = [g.uuid for g in needed_gpus(recorded, visible) if g.uuid not in here]
    return (f"the checkpoint's GPUs {', '.join(missing)} are not "
            f"{'given to this container' if given is not None and given.partial else 'on this node'}"
            ", and restoring onto other GPUs needs driver 580 (CUDA 13.0) or newer; this node "
            f"has {current.driver_version} (CUDA {format_version(version)})")


def partial_passthrough_refusal(current: GpuInventory, given: ContainerGpus | None,
                                doing: str) -> str | None:
    """Driver 570 up to 575.57.08 fails to checkpoint or restore a container given only some
    of the node's GPUs ("operation not permitted": cuda-checkpoint issues 12, 18, 24)."""
    if given is None or not given.partial or not partial_passthrough_broken(
            current.driver_version):
        return None
    return (f"this container is given {len(given.gpus)} of this node's {len(current.gpus)} GPUs "
            f"({given.source}), and NVIDIA driver {current.driver_version} cannot {doing} a "
            "container given only some GPUs (\"operation not permitted\"; fixed in 575.57.08): "
            "upgrade the driver, or give the container every GPU")


def mismatches(recorded: GpuInventory | None, current: GpuInventory | None,
               visible: tuple[str, ...] = (), given: ContainerGpus | None = None) -> list[str]:
    """Every reason this node cannot restore the recorded GPU state; empty when it can."""
    if recorded is None:
        return []  # no inventory was recorded (NVML was missing): nothing to compare
    if current is None:
        return ["the checkpoint holds GPU state, but this node has no NVIDIA driver (NVML "
                "cannot be loaded): restore on a node with NVIDIA GPUs"]
    out = []
    if given is not None and given.unknown:
        out.append(f"the container is given {', '.join(given.unknown)} ({given.source}), "
                   "which is no GPU of this node")
    out.extend(m for m in (_count_refusal(recorded, current, visible, given),) if m)
    if recorded.driver_version != current.driver_version:
        out.append(f"this node has NVIDIA driver {current.driver_version}; the "
                   f"checkpoint was taken with {recorded.driver_version}: install the "
                   "same driver version")
    for old, new in mapping(recorded, current, visible, given):
        if new is None:
            continue
        where = f"GPU {new.index}"
        if (new.name, new.architecture, new.compute_capability) != (
                old.name, old.architecture, old.compute_capability):
            out.append(f"{where} is a {new.model}; the checkpoint needs a {old.model}")
        if new.mig_mode == "on":
            out.append(f"{where} has MIG enabled, which CUDA checkpoints do not support: "
                       f"disable it (`nvidia-smi -i {new.index} -mig 0`)")
    out.extend(memory_shortfalls(recorded, current, visible, given))
    out.extend(m for m in (_remap_refusal(recorded, current, visible, given),
                           partial_passthrough_refusal(current, given, "restore")) if m)
    return out


def uuid_pairs(recorded: GpuInventory | None, current: GpuInventory | None,
               visible: tuple[str, ...] = (), given: ContainerGpus | None = None
               ) -> list[tuple[str, str]] | None:
    """None when the checkpoint's GPUs are all given here (no pairs: the driver's default
    path), else (old UUID, new UUID) for every GPU a restore must map. IncompatibleNode when
    pairs would be needed on a driver older than r580, or a GPU has no counterpart here."""
    if recorded is None or current is None or is_identity(recorded, current, visible, given):
        return None
    refusals = [m for m in (_count_refusal(recorded, current, visible, given),
                            _remap_refusal(recorded, current, visible, given)) if m]
    if refusals:
        raise IncompatibleNode(refusals)
    return [(old.uuid, new.uuid) for old, new in mapping(recorded, current, visible, given)
            if new is not None]
