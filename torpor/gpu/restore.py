"""A GPU restore, around `runc restore`: refuse early, then put the GPU state back while the
restored tasks are still stopped.

check_before_restore, before `runc restore`, refuses with every mismatch between the checkpoint
and this node and the GPUs the new container is given (compat.py, visibility.py), and plans
the GPU UUID pairs; the spec then asks CRIU to leave the restored tasks stopped
(criu_config.py). restore_gpus, after CRIU: for each CUDA process, with only the driver's
restore thread running (restore_thread.py), cuInit and restore (with the pairs), then unlock
each, check each is RUNNING, and let every process go on but those that were stopped when the
checkpoint was taken. Any failure raises: torpor-runc then kills the restored container.
Driver calls go through the plan's worker (worker.py), under torpor's deadline.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from torpor.capture.freezer import Cgroup
from torpor.capture.processes import ns_pid
from torpor.config import Config
from torpor.errors import IncompatibleNode, RestoreError
from torpor.formats.gpu import GpuState
from torpor.formats.oci import OciSpec
from torpor.gpu import compat, restore_thread, visibility
from torpor.gpu.cuda import ProcessState
from torpor.gpu.session import (
    ask_state,
    driver_present,
    held_bytes,
    is_stopped,
    new_worker,
    refuse_criu_cuda_plugin,
)
from torpor.gpu.visibility import ContainerGpus
from torpor.gpu.worker import DriverWorker
from torpor.reporting import Log


@dataclass
class RestorePlan:
    """What check_before_restore found, for restore_gpus: the worker (cuInit stays done in
    it), the GPUs the restored container is given, and the GPU UUID pairs (None: the same
    GPUs)."""

    worker: DriverWorker
    given: ContainerGpus | None
    pairs: list[tuple[str, str]] | None


def check_before_restore(cfg: Config, gpu_state: GpuState | None,
                         spec: OciSpec | None = None) -> RestorePlan | None:
    """Refuse early, naming every reason, when this node cannot take the GPU state; else the
    plan of the GPU restore."""
    if not gpu_state:
        return None
    refuse_criu_cuda_plugin()
    if not driver_present(cfg):
        raise IncompatibleNode([f"the checkpoint holds GPU state, but this node has no CUDA "
                                f"driver ({cfg.gpu_cuda_library} cannot be loaded)"])
    worker = new_worker(cfg)
    try:
        current = worker.inventory()
        given = visibility.container_gpus(current.gpus, spec) if current and spec else None
        visible = gpu_state.visible_gpus
        problems = compat.mismatches(gpu_state.inventory, current, visible, given)
        if problems:
            raise IncompatibleNode(problems)
        pairs = compat.uuid_pairs(gpu_state.inventory, current, visible, given)
    except BaseException:
        worker.close()
        raise
    return RestorePlan(worker, given, pairs)


def restore_gpus(cfg: Config, gpu_state: GpuState, plan: RestorePlan, cgroup: Cgroup,
                 log: Log, lazy: bool = False) -> list[int]:
    """After CRIU restored the processes, stopped: GPU restore (with UUID pairs) then unlock,
    each with only its restore thread running; then every process goes on. `lazy`: the
    processes' memory is still arriving from `torpor restore --lazy`'s page source, and the
    driver's copy back to the GPU reads the host copy as it comes (it faults each page in
    through userfaultfd: seen working on an H200, driver 580.159.04), so each copy is given the
    lazy restore's pace."""
    worker = plan.worker
    try:
        recorded = gpu_state.inventory
        current = worker.inventory()
        if recorded is not None and current is not None:
            shortfalls = compat.memory_shortfalls(recorded, current, gpu_state.visible_gpus,
                                                  plan.given)
            if shortfalls:
                raise IncompatibleNode(shortfalls)
        by_ns = {ns_pid(pid): pid for pid in cgroup.pids()}
        wanted = {p.ns_pid for p in gpu_state.processes}
        missing = sorted(wanted - set(by_ns))
        if missing:
            raise RestoreError(f"CUDA processes {missing} (pids in the container) were not "
                               "restored")
        pids = [by_ns[n] for n in sorted(wanted)]
        held = held_bytes(recorded)
        held_by_ns = {p.ns_pid: held.get(p.pid, 0) for p in gpu_state.processes}
        tids = {}
        for pid in pids:
            tid = worker.restore_thread(pid)
            if tid is None:
                raise RestoreError(f"pid {pid} (pid {ns_pid(pid)} in the container) was a CUDA "
                                   "process, but the driver knows no restore thread for it now")
            tids[pid] = tid
        with contextlib.ExitStack() as running:
            for pid in pids:
                running.enter_context(restore_thread.running_alone(pid, tids[pid]))
            for pid in pids:
                state, why = ask_state(worker, pid)
                if state != ProcessState.CHECKPOINTED:
                    raise RestoreError(f"pid {pid} is {state.name if state else why} after the "
                                       "CRIU restore; it must be CHECKPOINTED")
                worker.restore(pid, plan.pairs, held_by_ns.get(ns_pid(pid), 0), lazy)
            for pid in pids:
                worker.unlock(pid)
            for pid in pids:
                state, why = ask_state(worker, pid)
                if state != ProcessState.RUNNING:
                    raise RestoreError(f"pid {pid} is {state.name if state else why} after its "
                                       "GPU restore and unlock")
        keep_stopped = set(gpu_state.stopped_ns_pids)
        restore_thread.continue_processes(
            [pid for pid in cgroup.pids() if is_stopped(pid) and ns_pid(pid) not in keep_stopped])
    finally:
        worker.close()
    log.info(f"GPU: restored and unlocked CUDA processes {pids}"
             + (f" onto other GPUs {plan.pairs}" if plan.pairs else ""))
    return pids
