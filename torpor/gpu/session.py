"""GPU state around CRIU, driven out of band, in the order NVIDIA's own tooling uses.

Checkpoint, before `runc checkpoint` (suspend_for_checkpoint):
 1. find the container's CUDA processes (those the driver knows a restore thread for);
 2. refuse when CRIU's own cuda plugin would act on them too;
 3. record the GPU inventory with the memory each process holds (NVML lists a process only
    while it holds GPU memory, so before the lock);
 4. lock every CUDA process, with [gpu] lock_timeout_ms, then checkpoint each: its GPU memory
    moves into its host memory, which CRIU then dumps as ordinary pages.
The driver cannot lock frozen threads and its restore thread must run, so a container that
containerd paused (`ctr c checkpoint` does) is thawed for the driver calls and frozen again.
A failure at step 4 restores and unlocks what was locked. The undo pushed on the caller's
ExitStack does the same after the dump (--leave-running) or when a later step fails; after a
successful dump it raises if a process could not be resumed: a workload left locked is an
error, not a good checkpoint.

Restore: check_before_restore, before `runc restore`, refuses with every mismatch between the
checkpoint and this node (compat.py, free GPU memory included). resume_after_restore, after CRIU
restored the processes, finds them by their pid inside the container, checks free GPU memory
again (a restore that runs out of memory leaves the process unrestorable for good), restores
each (with GPU UUID pairs when this node's GPUs are other ones), then unlocks each.

rollback is the guardian's: torpor-runc died mid-checkpoint; put its processes back to running.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from torpor.capture.freezer import Cgroup, thawed
from torpor.capture.processes import ns_pid
from torpor.config import Config
from torpor.errors import CudaError, GpuError, IncompatibleNode, RestoreError
from torpor.formats.gpu import CudaProcess, GpuInventory, GpuState
from torpor.gpu import compat, cuda, inventory
from torpor.gpu.criu_plugin import installed_cuda_plugin
from torpor.gpu.cuda import CudaDriver, ProcessState
from torpor.reporting import Log

RETRY_DELAY_S = 0.2
OWNER_THAW_WAIT_S = 3.0  # rollback: how long containerd gets to resume its paused task
# Results a second try cannot change: the process's state or the GPU's memory decide them.
FINAL_RESULTS = (cuda.OUT_OF_MEMORY, cuda.OPERATING_SYSTEM, cuda.ILLEGAL_STATE)


def load_driver(cfg: Config) -> CudaDriver | None:
    """The CUDA driver binding, or None on a node without one (no GPU work to do)."""
    return cuda.try_load(cfg.gpu_cuda_library)


def refuse_criu_cuda_plugin() -> None:
    plugin = installed_cuda_plugin()
    if plugin:
        raise GpuError(f"CRIU's cuda plugin is installed ({plugin}): CRIU would lock, checkpoint "
                       "and restore the GPUs too, on top of torpor",
                       hint=f"remove {plugin}; torpor drives the CUDA driver itself")


def _twice(operation: Callable[..., None], pid: int, *args: Any) -> None:
    """Once more after a short pause, unless the driver's answer cannot change."""
    try:
        operation(pid, *args)
    except CudaError as e:
        if e.code in FINAL_RESULTS:
            raise
        time.sleep(RETRY_DELAY_S)
        operation(pid, *args)


def _no_room(cfg: Config, recorded: GpuInventory | None, pids: list[int]) -> dict[int, str]:
    """pid -> why restoring it now would run out of GPU memory (it then stays checkpointed)."""
    if not recorded or not pids:
        return {}
    current = inventory.gather_or_none(cfg.gpu_nvml_library, cfg.gpu_cuda_library)
    if current is None:
        return {}
    free = {g.uuid: g.memory_free for g in current.gpus}
    refused = {}
    for p in recorded.processes:
        pid, gpu, need = p.pid, p.gpu_uuid, p.used_memory
        if pid not in pids or gpu not in free:
            continue
        if need > free[gpu]:
            refused[pid] = (f"pid {pid} stays checkpointed: it needs {inventory.gib(need)} on "
                            f"{gpu}, which has {inventory.gib(free[gpu])} free (free GPU memory, "
                            "then restore and unlock it)")
        else:
            free[gpu] -= need
    return refused


def resume(cfg: Config, driver: CudaDriver, pids: list[int], log: Log,
           cgroup: Cgroup | None = None, recorded: GpuInventory | None = None) -> list[str]:
    """Restore every checkpointed and unlock every locked process; returns the failures."""
    failures: list[str] = []
    live = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    with thawed(cgroup):
        states: dict[int, ProcessState] = {}
        for pid in live:
            try:
                states[pid] = driver.state(pid)
            except GpuError as e:
                failures.append(str(e))
        checkpointed = [pid for pid, state in states.items() if state == ProcessState.CHECKPOINTED]
        refused = _no_room(cfg, recorded, checkpointed)
        failures.extend(refused.values())
        for pid in checkpointed:
            if pid in refused:
                continue
            try:
                _twice(driver.restore, pid)
                states[pid] = ProcessState.LOCKED
            except GpuError as e:
                failures.append(str(e))
        for pid, state in states.items():
            if state == ProcessState.LOCKED:
                try:
                    _twice(driver.unlock, pid)
                except GpuError as e:
                    failures.append(str(e))
    for failure in failures:
        log.error(f"GPU resume: {failure}")
    return failures


class _Resume:
    """The undo of a GPU suspension, for an ExitStack (push): resume everything; after a
    successful block, fail loudly if a process could not be resumed."""

    def __init__(self, cfg: Config, driver: CudaDriver, pids: list[int], log: Log,
                 cgroup: Cgroup, recorded: GpuInventory | None) -> None:
        self.args = (cfg, driver, pids, log, cgroup, recorded)

    def __call__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        failures = resume(*self.args)
        if failures and exc_type is None:
            raise GpuError("the checkpoint was written, but the workload's GPU state could not be "
                           "resumed: " + "; ".join(failures),
                           hint="the CUDA processes named stay locked or checkpointed")
        return False


def _lock(driver: CudaDriver, pid: int, timeout_ms: int) -> None:
    try:
        driver.lock(pid, timeout_ms)
    except CudaError as e:
        if e.code != cuda.NOT_READY:
            raise
        raise GpuError(f"pid {pid} could not be locked within {timeout_ms} ms: its CUDA work did "
                       "not reach a point where it can stop (CUDA_ERROR_NOT_READY)",
                       hint="the container keeps running; retry, or raise [gpu] lock_timeout_ms "
                       "in the torpor config") from None


def suspend_for_checkpoint(cfg: Config, cgroup: Cgroup, undo: contextlib.ExitStack, log: Log,
                           leave_running: bool,
                           on_locked: Callable[[list[int]], None] = lambda pids: None,
                           ) -> GpuState | None:
    """Lock, then checkpoint, the container's CUDA processes; `undo` resumes them. Returns
    what restore needs (None: no CUDA process, nothing to do)."""
    driver = load_driver(cfg)
    if driver is None:
        return None
    locked: list[int] = []
    with thawed(cgroup):
        cuda_pids = [pid for pid in cgroup.pids() if driver.is_cuda_process(pid)]
        if not cuda_pids:
            return None
        refuse_criu_cuda_plugin()
        recorded = inventory.gather_or_none(cfg.gpu_nvml_library, cfg.gpu_cuda_library,
                                            pids=cuda_pids)
        version = driver.driver_version()
        processes = tuple(CudaProcess(pid=pid, ns_pid=ns_pid(pid)) for pid in cuda_pids)
        try:
            for pid in cuda_pids:
                _lock(driver, pid, cfg.gpu_lock_timeout_ms)
                locked.append(pid)
                on_locked(list(locked))
            for pid in cuda_pids:
                driver.checkpoint(pid)
        except BaseException as e:
            failures = resume(cfg, driver, locked, log, recorded=recorded)
            if isinstance(e, GpuError) and not failures:
                e.message += "; the CUDA processes were unlocked and keep running"
            raise
    undo.push(_Resume(cfg, driver, cuda_pids, log, cgroup, recorded))
    log.info(f"GPU: locked and checkpointed CUDA processes {cuda_pids}")
    return GpuState(cuda_driver_version=version, processes=processes, inventory=recorded)


def rollback(cfg: Config, pids: list[int], log: Log) -> None:
    """From the guardian: torpor-runc died; put every process it locked back to running.

    containerd paused the task before the checkpoint and resumes it as soon as the runtime
    call fails. Thawing and freezing again around the driver calls at that moment would race
    with that resume (runc refuses to resume a task that is not paused, and containerd would
    keep it "paused"), so the owner gets a moment to thaw it first."""
    driver = load_driver(cfg)
    live = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    if driver is None or not live:
        return
    try:
        cgroup: Cgroup | None = Cgroup.of_pid(live[0])
    except Exception:
        cgroup = None
    deadline = time.monotonic() + OWNER_THAW_WAIT_S
    while cgroup is not None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if not cgroup.is_frozen():
                break
        time.sleep(0.02)
    resume(cfg, driver, live, log, cgroup)


def check_before_restore(cfg: Config, gpu_state: GpuState | None) -> None:
    """Refuse early, naming every reason, when this node cannot take the GPU state."""
    if not gpu_state:
        return
    refuse_criu_cuda_plugin()
    if load_driver(cfg) is None:
        raise IncompatibleNode([f"the checkpoint holds GPU state, but this node has no CUDA "
                                f"driver ({cfg.gpu_cuda_library} cannot be loaded)"])
    current = inventory.gather_or_none(cfg.gpu_nvml_library, cfg.gpu_cuda_library)
    problems = compat.mismatches(gpu_state.inventory, current)
    if problems:
        raise IncompatibleNode(problems)


def resume_after_restore(cfg: Config, gpu_state: GpuState | None, cgroup: Cgroup,
                         log: Log) -> list[int]:
    """After CRIU restored the processes: GPU restore (with UUID pairs) then unlock, each."""
    if not gpu_state:
        return []
    driver = load_driver(cfg)
    if driver is None:
        raise RestoreError("the checkpoint holds GPU state but this node has no CUDA driver")
    recorded = gpu_state.inventory
    current = inventory.gather_or_none(cfg.gpu_nvml_library, cfg.gpu_cuda_library)
    pairs = compat.uuid_pairs(recorded, current)
    if recorded is not None and current is not None:
        shortfalls = compat.memory_shortfalls(recorded, current)
        if shortfalls:
            raise IncompatibleNode(shortfalls)
    wanted = {p.ns_pid for p in gpu_state.processes}
    by_ns = {ns_pid(pid): pid for pid in cgroup.pids()}
    missing = sorted(wanted - set(by_ns))
    if missing:
        raise RestoreError(f"CUDA processes {missing} (pids in the container) were not restored")
    pids = [by_ns[n] for n in sorted(wanted)]
    with thawed(cgroup):
        for pid in pids:
            driver.restore(pid, pairs)
        for pid in pids:
            driver.unlock(pid)
    log.info(f"GPU: restored and unlocked CUDA processes {pids}"
             + (f" onto other GPUs {pairs}" if pairs else ""))
    return pids
