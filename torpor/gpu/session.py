"""GPU state around CRIU, in the order NVIDIA's own tooling uses, driven out of band.

Checkpoint: lock every CUDA process of the container (with a timeout), then checkpoint each, so
GPU memory is in host memory and CRIU dumps it as ordinary pages; with --leave-running, after the
dump: restore each, then unlock each. The driver cannot lock frozen threads, so a container
containerd paused is thawed for these calls and frozen again. Any failure restores and unlocks
whatever was locked: the workload keeps running on its GPU.

Restore: check free GPU memory first (a restore that runs out of memory wedges the process for
good), let CRIU restore the processes, then restore each (with GPU UUID pairs when this node's
GPUs are other ones) and unlock each. CRIU's own cuda plugin must not act at the same time:
torpor-runc refuses to run when it is installed where CRIU would load it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from torpor.config import Config
from torpor.errors import GpuError, RestoreError
from torpor.freezer import Cgroup

CRIU_PLUGIN_DIRS = ("/usr/lib/criu", "/usr/local/lib/criu")


def load_driver(cfg: Config) -> Any:
    """The CUDA driver binding, or None on a node without one (no GPU work to do)."""
    from torpor.gpu import cuda

    return cuda.try_load(cfg.gpu_cuda_library)


def ns_pid(pid: int) -> int:
    """pid as the container sees it (the last NSpid), which CRIU keeps across a restore."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except OSError:
        pass
    return pid


def cuda_plugin_installed() -> str | None:
    for directory in CRIU_PLUGIN_DIRS:
        path = os.path.join(directory, "cuda_plugin.so")
        if os.path.exists(path):
            return path
    return None


@contextlib.contextmanager
def _thawed(cgroup: Cgroup | None) -> Any:
    """Thaw for the block if frozen (the driver's restore thread must run), then freeze again."""
    frozen = cgroup is not None and os.path.isdir(cgroup.path) and cgroup.is_frozen()
    if frozen and cgroup is not None:
        cgroup.thaw()
    try:
        yield
    finally:
        if frozen and cgroup is not None:
            cgroup.freeze()


def resume(driver: Any, pids: list[int], log: Any, cgroup: Cgroup | None = None) -> list[str]:
    """Restore every checkpointed and unlock every locked process; returns the failures."""
    from torpor.gpu.cuda import ProcessState

    failures = []
    with _thawed(cgroup):
        for pid in pids:
            try:
                if driver.state(pid) == ProcessState.CHECKPOINTED:
                    driver.restore(pid)
            except GpuError as e:
                failures.append(str(e))
        for pid in pids:
            try:
                if driver.state(pid) == ProcessState.LOCKED:
                    driver.unlock(pid)
            except GpuError as e:
                failures.append(str(e))
    for failure in failures:
        log.error(f"GPU resume: {failure}")
    return failures


def suspend_for_checkpoint(cfg: Config, cgroup: Cgroup, undo: contextlib.ExitStack, log: Any,
                           leave_running: bool,
                           on_locked: Callable[[list[int]], None] = lambda pids: None,
                           ) -> dict[str, Any] | None:
    """Lock and checkpoint the container's CUDA processes; `undo` resumes them."""
    driver = load_driver(cfg)
    if driver is None:
        return None
    plugin = cuda_plugin_installed()
    if plugin:
        raise GpuError(f"CRIU's cuda plugin is installed ({plugin}): it would act on the GPUs "
                       "at the same time as torpor", hint="remove it; torpor drives the driver")
    cuda_pids = [pid for pid in cgroup.pids() if driver.is_cuda_process(pid)]
    if not cuda_pids:
        return None
    from torpor.gpu import inventory

    inv = inventory.gather_or_none(cfg.gpu_nvml_library, cfg.gpu_cuda_library)
    locked: list[int] = []
    with _thawed(cgroup):
        try:
            for pid in cuda_pids:
                driver.lock(pid, cfg.gpu_lock_timeout_ms)
                locked.append(pid)
                on_locked(locked)
            for pid in cuda_pids:
                driver.checkpoint(pid)
        except BaseException:
            resume(driver, locked, log)
            raise
    undo.callback(resume, driver, cuda_pids, log, cgroup)
    log.info(f"GPU: locked and checkpointed CUDA processes {cuda_pids}")
    return {
        "driver_version": driver.driver_version(),
        "processes": [{"pid": pid, "ns_pid": ns_pid(pid)} for pid in cuda_pids],
        "inventory": inv,
    }


def rollback(cfg: Config, pids: list[int], log: Any) -> None:
    """From the guardian: torpor-runc died; put every process it locked back to running."""
    driver = load_driver(cfg)
    if driver is not None:
        live = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
        resume(driver, live, log)


def check_before_restore(cfg: Config, gpu_state: dict[str, Any] | None) -> None:
    """Refuse early, naming every reason, when this node cannot take the GPU state."""
    if not gpu_state:
        return
    if load_driver(cfg) is None:
        raise RestoreError("the checkpoint holds GPU state but this node has no CUDA driver")
    from torpor.gpu import compat, inventory

    current = inventory.gather_or_none(cfg.gpu_nvml_library, cfg.gpu_cuda_library)
    mismatches = compat.mismatches(gpu_state.get("inventory"), current)
    if mismatches:
        from torpor.errors import IncompatibleNode

        raise IncompatibleNode(mismatches)


def resume_after_restore(cfg: Config, gpu_state: dict[str, Any] | None, cgroup: Cgroup,
                         log: Any) -> list[int]:
    """After CRIU restored the processes: GPU restore (with UUID pairs) then unlock, each."""
    if not gpu_state:
        return []
    driver = load_driver(cfg)
    if driver is None:
        raise RestoreError("the checkpoint holds GPU state but this node has no CUDA driver")
    from torpor.gpu import compat, inventory

    current = inventory.gather_or_none(cfg.gpu_nvml_library, cfg.gpu_cuda_library)
    pairs = compat.uuid_pairs(gpu_state.get("inventory"), current)
    wanted = {p["ns_pid"] for p in gpu_state.get("processes", [])}
    by_ns = {ns_pid(pid): pid for pid in cgroup.pids()}
    pids = [by_ns[n] for n in sorted(wanted) if n in by_ns]
    missing = sorted(wanted - set(by_ns))
    if missing:
        raise RestoreError(f"CUDA processes {missing} (container pids) were not restored")
    restored: list[int] = []
    try:
        for pid in pids:
            driver.restore(pid, pairs)
            restored.append(pid)
        for pid in pids:
            driver.unlock(pid)
    except GpuError:
        log.error(f"GPU restore failed after CRIU restored pids {pids}")
        raise
    log.info(f"GPU: restored and unlocked CUDA processes {pids}")
    return pids
