"""The node's GPUs and a container's GPU processes, through NVML (nvidia-ml-py, `import pynvml`).

This is the only module that imports pynvml, and every NVMLError becomes a GpuError here. The
inventory (torpor.formats.gpu.GpuInventory) is kept in a checkpoint's metadata, compared with the
restore node's by compat.py and shown by `torpor inspect`.

`processes` lists the running compute processes among the pids asked for (host pids), and is
empty when none were asked for. `mps_clients` lists those among them that are clients of an
MPS server (NVML lists them apart), which CUDA checkpoints do not support.
"""

from __future__ import annotations

import ctypes
from collections.abc import Collection
from typing import Any

from torpor.errors import GpuError
from torpor.formats.gpu import GpuDevice, GpuInventory, GpuProcessMemory
from torpor.formats.node import Requirement
from torpor.gpu.cuda import format_version

API_MIN_DRIVER = 570  # the public cuCheckpointProcess* API
REMAP_MIN_DRIVER = 580  # GPU UUID pairs on restore
# Driver 570 fails with "operation not permitted" on a container given only some of the
# node's GPUs (cuda-checkpoint issues 12, 18, 24); reported fixed in 575.57.08 (issue 24).
PARTIAL_PASSTHROUGH_FIXED = (575, 57, 8)

ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
                 8: "Ada", 9: "Hopper", 10: "Blackwell", 13: "Rubin"}

# NVML results that mean "no driver here", not "something is wrong".
_NO_DRIVER = ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")


def _nvml() -> Any:
    import pynvml

    return pynvml


def _use_library(path: str) -> bool:
    """Make pynvml use the NVML library at `path` (absolute path or soname); False when it
    cannot be loaded. pynvml keeps the library in its module global `nvmlLib` and loads
    libnvidia-ml.so.1 itself only when that is None, so it is set before nvmlInit."""
    pynvml = _nvml()
    if getattr(pynvml, "_torpor_library_path", None) == path and pynvml.nvmlLib is not None:
        return True
    try:
        library = ctypes.CDLL(path)
    except OSError:
        return False
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()  # function pointers of another library
        pynvml._torpor_library_path = path
    return True


def _error(e: Exception, doing: str) -> GpuError:
    return GpuError(f"NVML could not {doing}: {e}")


def _call(doing: str, fn: Any, *args: Any) -> Any:
    pynvml = _nvml()
    try:
        return fn(*args)
    except pynvml.NVMLError as e:
        raise _error(e, doing) from None


def _optional(fn: Any, *args: Any) -> Any:
    """A query some GPUs do not answer (NVML_ERROR_NOT_SUPPORTED): None then."""
    pynvml = _nvml()
    try:
        return fn(*args)
    except pynvml.NVMLError_NotSupported:
        return None
    except pynvml.NVMLError as e:
        raise _error(e, f"run {fn.__name__}") from None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _gpu(index: int) -> GpuDevice:
    pynvml = _nvml()
    handle = _call(f"open GPU {index}", pynvml.nvmlDeviceGetHandleByIndex, index)
    memory = _call(f"read the memory of GPU {index}", pynvml.nvmlDeviceGetMemoryInfo, handle)
    major, minor = _call(f"read the compute capability of GPU {index}",
                         pynvml.nvmlDeviceGetCudaComputeCapability, handle)
    arch = _optional(pynvml.nvmlDeviceGetArchitecture, handle)
    mig = _optional(pynvml.nvmlDeviceGetMigMode, handle)
    persistence = _optional(pynvml.nvmlDeviceGetPersistenceMode, handle)
    return GpuDevice(
        index=index,
        uuid=_text(_call(f"read the UUID of GPU {index}", pynvml.nvmlDeviceGetUUID, handle)),
        name=_text(_call(f"read the name of GPU {index}", pynvml.nvmlDeviceGetName, handle)),
        architecture=ARCHITECTURES.get(arch, f"unknown ({arch})") if arch is not None
        else "unknown",
        compute_capability=f"{major}.{minor}",
        memory_total=int(memory.total),
        memory_used=int(memory.used),
        memory_free=int(memory.free),
        pci_bus_id=_text(_call(f"read the PCI address of GPU {index}",
                               pynvml.nvmlDeviceGetPciInfo, handle).busId),
        minor_number=_optional(pynvml.nvmlDeviceGetMinorNumber, handle),
        mig_mode="unsupported" if mig is None else ("on" if mig[0] else "off"),
        persistence_mode=bool(persistence),
    )


def _processes(index: int, uuid: str, pids: Collection[int]) -> list[GpuProcessMemory]:
    pynvml = _nvml()
    handle = _call(f"open GPU {index}", pynvml.nvmlDeviceGetHandleByIndex, index)
    running = _call(f"list the processes on GPU {index}",
                    pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
    return [GpuProcessMemory(pid=int(p.pid), gpu_uuid=uuid, used_memory=int(p.usedGpuMemory or 0))
            for p in running if int(p.pid) in pids]


def _cuda_driver(cuda_library: str) -> tuple[int | None, bool]:
    """cuDriverGetVersion through torpor's binding, and whether the checkpoint API is there."""
    from torpor.gpu import cuda

    try:
        driver = cuda.try_load(cuda_library)
    except GpuError:
        return None, False  # a libcuda without cuCheckpointProcess*: a driver before r570
    return (driver.driver_version(), True) if driver is not None else (None, False)


def gather(nvml_library: str, cuda_library: str,
           pids: Collection[int] = ()) -> GpuInventory:
    """The inventory; GpuError when NVML cannot be loaded or answers with an error."""
    inventory = gather_or_none(nvml_library, cuda_library, pids)
    if inventory is None:
        raise GpuError(f"no NVIDIA driver: NVML ({nvml_library}) cannot be loaded or started",
                       hint="install the NVIDIA driver, or set [gpu] nvml_library in the torpor "
                       "config")
    return inventory


def gather_or_none(nvml_library: str, cuda_library: str,
                   pids: Collection[int] = ()) -> GpuInventory | None:
    """The inventory, or None when this node has no NVML or no driver loaded."""
    if not _use_library(nvml_library):
        return None
    pynvml = _nvml()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        if any(getattr(pynvml, name, None) == e.value for name in _NO_DRIVER):
            return None
        raise _error(e, "start") from None
    try:
        count = _call("count the GPUs", pynvml.nvmlDeviceGetCount)
        gpus = [_gpu(index) for index in range(count)]
        processes = [p for g in gpus for p in _processes(g.index, g.uuid, set(pids))]
        cuda_version, api = _cuda_driver(cuda_library)
        if cuda_version is None:
            cuda_version = _call("read the CUDA driver version",
                                 pynvml.nvmlSystemGetCudaDriverVersion_v2)
        return GpuInventory(
            driver_version=_text(_call("read the driver version",
                                       pynvml.nvmlSystemGetDriverVersion)),
            cuda_driver_version=int(cuda_version),
            checkpoint_api=api,
            gpus=tuple(gpus),
            processes=tuple(sorted(processes, key=lambda p: (p.pid, p.gpu_uuid))),
        )
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def mps_clients(nvml_library: str, pids: Collection[int]) -> list[int]:
    """The pids among `pids` that NVML lists as clients of an MPS server, on any GPU."""
    if not pids or not _use_library(nvml_library):
        return []
    pynvml = _nvml()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        found: set[int] = set()
        for index in range(_call("count the GPUs", pynvml.nvmlDeviceGetCount)):
            handle = _call(f"open GPU {index}", pynvml.nvmlDeviceGetHandleByIndex, index)
            clients = _optional(pynvml.nvmlDeviceGetMPSComputeRunningProcesses, handle) or []
            found.update(int(p.pid) for p in clients if int(p.pid) in pids)
        return sorted(found)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def driver_tuple(version: str) -> tuple[int, ...]:
    """'575.57.08' -> (575, 57, 8); () when unreadable."""
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return ()


def partial_passthrough_broken(version: str) -> bool:
    """Does this driver fail on containers given only some of the node's GPUs?"""
    parts = driver_tuple(version)
    return bool(parts) and (API_MIN_DRIVER,) <= parts < PARTIAL_PASSTHROUGH_FIXED


def gib(value: int) -> str:
    return f"{value / (1 << 30):.1f} GiB"


def describe(inventory: GpuInventory) -> list[str]:
    """One line for the driver, one per GPU, one per process: for `torpor inspect`."""
    lines = [f"NVIDIA driver {inventory.driver_version}, CUDA "
             f"{format_version(inventory.cuda_driver_version)}"]
    for g in inventory.gpus:
        lines.append(f"GPU {g.index}: {g.model}, {gib(g.memory_total)}, {g.uuid}, PCI "
                     f"{g.pci_bus_id}, MIG {g.mig_mode}, persistence mode "
                     f"{'on' if g.persistence_mode else 'off'}")
    for p in inventory.processes:
        lines.append(f"pid {p.pid}: {gib(p.used_memory)} on {p.gpu_uuid}")
    return lines


def requirements(inventory: GpuInventory | None) -> list[Requirement]:
    """What `torpor check` reports about GPU checkpointing on this node."""
    if inventory is None:
        return [Requirement("gpu driver", "skip", "no NVIDIA driver loaded (GPU checkpoint off)")]
    gpus = inventory.gpus
    out = []
    if gpus:
        models = sorted({g.name for g in gpus})
        out.append(Requirement("gpus", "ok", f"{len(gpus)} x {', '.join(models)}"))
    else:
        out.append(Requirement("gpus", "warn", "the NVIDIA driver is loaded but NVML sees no GPU"))
    major, version = inventory.driver_major, inventory.driver_version
    if major < API_MIN_DRIVER or not inventory.checkpoint_api:
        out.append(Requirement("gpu driver", "fail", f"{version}: the CUDA checkpoint API needs "
                               f"driver {API_MIN_DRIVER} or newer"))
    elif major < REMAP_MIN_DRIVER:
        caveat = (" and a container given only some of this node's GPUs cannot be checkpointed "
                  "or restored ('operation not permitted', fixed in 575.57.08)"
                  if partial_passthrough_broken(version) else "")
        out.append(Requirement("gpu driver", "warn", f"{version}: restores only onto the same "
                               f"GPUs (other GPUs need driver {REMAP_MIN_DRIVER} or newer)"
                               + caveat))
    else:
        out.append(Requirement("gpu driver", "ok", f"{version} (CUDA "
                               f"{format_version(inventory.cuda_driver_version)})"))
    off = [str(g.index) for g in gpus if not g.persistence_mode]
    out.append(Requirement("gpu persistence mode", "warn" if off else "ok",
                           f"off on GPU {', '.join(off)}: torpor calls cuInit before each GPU "
                           "restore instead; `nvidia-smi -pm 1` (or nvidia-persistenced) keeps "
                           "the driver loaded between calls" if off else "on"))
    mig = [str(g.index) for g in gpus if g.mig_mode == "on"]
    out.append(Requirement("gpu MIG", "fail" if mig else "ok",
                           f"enabled on GPU {', '.join(mig)}: CUDA checkpoints do not support "
                           "MIG; disable it with `nvidia-smi -i N -mig 0`" if mig else "off"))
    return out
