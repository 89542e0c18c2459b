"""GPU state as torpor records it: the node's GPU inventory (NVML), the CUDA processes a
checkpoint locked and checkpointed, and the GPUs the container could see (a process can hold
memory on several, and the driver checkpoints every GPU it sees, used or not)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torpor.errors import FormatError
from torpor.formats.fields import Fields
from torpor.formats.flat import from_flat, to_flat


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    name: str
    architecture: str
    compute_capability: str
    memory_total: int
    memory_used: int
    memory_free: int
    pci_bus_id: str
    minor_number: int | None
    mig_mode: str                 # "on", "off" or "unsupported"
    persistence_mode: bool

    @property
    def model(self) -> str:
        return (f"{self.name} ({self.architecture}, compute capability "
                f"{self.compute_capability})")


@dataclass(frozen=True)
class GpuProcessMemory:
    """GPU memory one process holds on one GPU (NVML lists a process only while it holds some)."""

    pid: int
    gpu_uuid: str
    used_memory: int


@dataclass(frozen=True)
class GpuInventory:
    driver_version: str
    cuda_driver_version: int
    checkpoint_api: bool
    gpus: tuple[GpuDevice, ...] = ()
    processes: tuple[GpuProcessMemory, ...] = ()

    @property
    def driver_major(self) -> int:
        """'580.65.06' -> 580; 0 when unreadable."""
        head = self.driver_version.split(".", 1)[0]
        return int(head) if head.isdigit() else 0

    def to_json(self) -> dict[str, Any]:
        return {"driver_version": self.driver_version,
                "cuda_driver_version": self.cuda_driver_version,
                "checkpoint_api": self.checkpoint_api, "gpus": [to_flat(g) for g in self.gpus],
                "processes": [to_flat(p) for p in self.processes]}

    @classmethod
    def from_json(cls, f: Fields) -> GpuInventory:
        return cls(driver_version=f.string("driver_version"),
                   cuda_driver_version=f.integer("cuda_driver_version", 0),
                   checkpoint_api=f.boolean("checkpoint_api", True),
                   gpus=tuple(from_flat(GpuDevice, g) for g in f.children("gpus")),
                   processes=tuple(from_flat(GpuProcessMemory, p)
                                   for p in f.children("processes")))


@dataclass(frozen=True)
class CudaProcess:
    """A CUDA process of the container: its host pid then, and its pid inside the container,
    which CRIU keeps across a restore."""

    pid: int
    ns_pid: int


@dataclass(frozen=True)
class GpuState:
    """What a restore needs of a checkpoint's GPUs.

    visible_gpus: the UUIDs of the GPUs the container could see (its /dev/nvidiaN), in NVML
    index order; a restore maps every one of them (empty in older checkpoints: every
    recorded GPU is then taken as seen).
    stopped_ns_pids: processes that were stopped (SIGSTOP) when the checkpoint was taken: a
    GPU restore holds every process stopped until the GPUs are back, then continues all but
    these."""

    cuda_driver_version: int
    processes: tuple[CudaProcess, ...]
    inventory: GpuInventory | None
    visible_gpus: tuple[str, ...] = ()
    stopped_ns_pids: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"cuda_driver_version": self.cuda_driver_version,
                "processes": [to_flat(p) for p in self.processes],
                "inventory": self.inventory.to_json() if self.inventory else None,
                "visible_gpus": list(self.visible_gpus),
                "stopped_ns_pids": list(self.stopped_ns_pids)}

    @classmethod
    def from_json(cls, f: Fields) -> GpuState:
        inventory = f.optional_child("inventory")
        visible = f.strings("visible_gpus")
        for i, uuid in enumerate(visible):
            if not uuid.startswith("GPU-"):
                raise FormatError(f"{f.what}: visible_gpus[{i}] is not a GPU UUID: {uuid!r}")
        stopped = f.data.get("stopped_ns_pids") or []
        if not isinstance(stopped, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in stopped):
            raise FormatError(f"{f.what}: stopped_ns_pids must be a list of pids")
        return cls(cuda_driver_version=f.integer("cuda_driver_version", 0),
                   processes=tuple(from_flat(CudaProcess, p) for p in f.children("processes")),
                   inventory=GpuInventory.from_json(inventory) if inventory else None,
                   visible_gpus=tuple(visible), stopped_ns_pids=tuple(stopped))
