"""GPU state around CRIU, driven out of band, in the order NVIDIA's own tooling uses.

Every driver call goes through a worker (worker.py), under torpor's own deadline: a hung
driver makes the call fail with DriverTimeout, never hangs torpor-runc (so containerd).

Checkpoint, before `runc checkpoint` (suspend_for_checkpoint):
 1. find the container's CUDA processes: those the driver knows a restore thread for. Only
    INVALID_VALUE and NOT_INITIALIZED mean "not a CUDA process" (as in CRIU's cuda plugin);
    any other answer is an error with the driver's words, never a CPU-only checkpoint;
 2. record the GPU inventory with the memory each process holds (NVML lists a process only
    while it holds GPU memory, so before the lock) and the GPUs the container sees;
 3. refuse, all reasons at once and before anything is locked, what cannot be checkpointed:
    CRIU's own cuda plugin acting too; a process the driver already holds LOCKED,
    CHECKPOINTED or FAILED; MIG on a GPU the container sees, MPS clients, UVM managed memory
    (mappings of /dev/nvidia-uvm beyond the CUDA runtime's own window: managed_memory); a
    container given only some GPUs on drivers 570 to 575.57.07. What these checks miss, the
    driver refuses at checkpoint (CUDA_ERROR_NOT_SUPPORTED, the process left LOCKED: seen on
    an H200 with driver 580.159.04), and the undo unlocks it.
    With persistence mode off on a GPU the container sees, cuInit runs now: the resume needs
    it ("restore requires persistence mode to be enabled or cuInit to have been called"), and
    if it fails nothing has changed yet;
 4. lock every CUDA process, with [gpu] lock_timeout_ms, then checkpoint each: its GPU memory
    moves into its host memory, which CRIU then dumps as ordinary pages. A pid is made known
    (to the undo and the guardian) *before* its lock call: a lock that fails, times out or is
    cut short may have locked it all the same (CRIU reads the state again after a failed lock
    for this reason).
The driver cannot lock frozen threads and its restore thread must run, so a container that
containerd paused is thawed for the driver calls and frozen again.

Resume (resume), after a failure, after the dump with --leave-running, and in the guardian
(rollback) when torpor-runc was killed: for each process the driver's state decides:
CHECKPOINTED -> cuInit, then restore (unless it would not fit in GPU memory: a restore that
runs out of memory leaves the process unrestorable for good, cuda-checkpoint issue 44),
LOCKED -> unlock, RUNNING -> nothing, FAILED -> an error that says so (its GPU state is lost).
A state the driver does not tell (the query fails or times out) is taken to be what torpor
last did to the process. Every process that does not end RUNNING is named, with the state it
is left in.

The restore side is restore.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from torpor.capture.freezer import Cgroup, thawed
from torpor.capture.processes import ns_pid
from torpor.config import Config
from torpor.errors import CudaError, GpuError
from torpor.formats.gpu import CudaProcess, GpuInventory, GpuState
from torpor.formats.oci import OciSpec
from torpor.gpu import compat, cuda, inventory, visibility
from torpor.gpu.criu_plugin import installed_cuda_plugin
from torpor.gpu.cuda import ProcessState
from torpor.gpu.visibility import ContainerGpus
from torpor.gpu.worker import DriverTimeout, DriverWorker
from torpor.reporting import Log

RETRY_DELAY_S = 0.2
OWNER_THAW_WAIT_S = 3.0  # rollback: how long containerd gets to resume its paused task
# Results a second try cannot change: the process's state or the GPU's memory decide them.
FINAL_RESULTS = (cuda.OUT_OF_MEMORY, cuda.OPERATING_SYSTEM, cuda.ILLEGAL_STATE)
FAILED_WORDS = ("is in the driver's FAILED state (\"an uncorrectable error during the "
                "checkpoint/restore process\"): its GPU state is lost; restart it")

OnCall = Callable[[int, float], None]
T = TypeVar("T")


def driver_present(cfg: Config) -> bool:
    """Is there a CUDA driver library (with the checkpoint API) on this node? It is only
    looked up here; every call goes through a worker."""
    return cuda.try_load(cfg.gpu_cuda_library) is not None


def new_worker(cfg: Config, on_call: OnCall = lambda pid, deadline: None) -> DriverWorker:
    return DriverWorker(cfg.gpu_cuda_library, cfg.gpu_nvml_library, cfg.gpu_driver_timeout_s,
                        cfg.gpu_lock_timeout_ms, on_call)


def refuse_criu_cuda_plugin() -> None:
    plugin = installed_cuda_plugin()
    if plugin:
        raise GpuError(f"CRIU's cuda plugin is installed ({plugin}): CRIU would lock, checkpoint "
                       "and restore the GPUs too, on top of torpor",
                       hint=f"remove {plugin}; torpor drives the CUDA driver itself")


class _Calls:
    """The driver calls of one resume. A call the driver did not answer in time is tried once
    more with a new worker (a passing hang); after two such in a row no more calls are made
    (each would wait as long), and the processes left are reported as unknown."""

    def __init__(self, worker: DriverWorker) -> None:
        self.worker = worker
        self.timeouts = 0
        self.hung: DriverTimeout | None = None

    def _do(self, call: Callable[[], T]) -> T:
        if self.hung is not None:
            raise DriverTimeout(f"not tried, the driver stopped answering: {self.hung}",
                                self.hung.operation, self.hung.pid)
        try:
            value = call()
        except DriverTimeout as e:
            self.timeouts += 1
            if self.timeouts >= 2:
                self.hung = e
            raise
        self.timeouts = 0
        return value

    def state(self, pid: int) -> int:
        return self._do(lambda: self.worker.state(pid))

    def restore(self, pid: int, held: int) -> None:
        self._do(lambda: self.worker.restore(pid, None, held))

    def unlock(self, pid: int) -> None:
        self._do(lambda: self.worker.unlock(pid))

    def inventory(self) -> GpuInventory | None:
        return self._do(self.worker.inventory)


def ask_state(worker: DriverWorker | _Calls, pid: int) -> tuple[ProcessState | None, str]:
    """The driver's state of pid, or None and why it cannot tell."""
    try:
        return ProcessState(worker.state(pid)), ""
    except ValueError:
        return None, f"the driver reports an unknown checkpoint state for pid {pid}"
    except GpuError as e:
        return None, str(e)


def held_bytes(recorded: GpuInventory | None) -> dict[int, int]:
    held: dict[int, int] = {}
    for p in recorded.processes if recorded else ():
        held[p.pid] = held.get(p.pid, 0) + p.used_memory
    return held


def _no_room(worker: _Calls, recorded: GpuInventory | None,
             pids: list[int]) -> dict[int, str]:
    """pid -> why restoring it now would run out of GPU memory (it then stays checkpointed)."""
    if not recorded or not pids:
        return {}
    try:
        current = worker.inventory()
    except GpuError:
        return {}
    if current is None:
        return {}
    free = {g.uuid: g.memory_free for g in current.gpus}
    refused: dict[int, str] = {}
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


def _tolerated(e: GpuError, guessed: bool) -> bool:
    """An ILLEGAL_STATE answer to a step tried on a guessed state: it was not needed."""
    return guessed and isinstance(e, CudaError) and e.code == cuda.ILLEGAL_STATE


def resume(cfg: Config, worker: DriverWorker, pids: list[int], log: Log,
           cgroup: Cgroup | None = None, recorded: GpuInventory | None = None,
           assumed: dict[int, ProcessState] | None = None) -> list[str]:
    """Bring every process back to RUNNING by the driver's state: restore all, then unlock all
    (as NVIDIA's tooling does), and once more after a short pause for those a passing error
    or hang held back. Returns the failures, each naming where a process is left."""
    live = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    held = held_bytes(recorded)
    calls = _Calls(worker)
    errors: dict[int, list[str]] = {pid: [] for pid in live}
    final: dict[int, str] = {}  # pid -> its failure, decided: no further try
    with thawed(cgroup):
        asked = {pid: ask_state(calls, pid) for pid in live}
        guessed = {pid for pid, (state, _) in asked.items() if state is None}
        states = {pid: state if state is not None else (assumed or {}).get(pid)
                  for pid, (state, _) in asked.items()}
        refused = _no_room(calls, recorded, [pid for pid, state in states.items()
                                            if state == ProcessState.CHECKPOINTED])
        for attempt in range(2):
            if attempt:
                time.sleep(RETRY_DELAY_S)
                states = {pid: ask_state(calls, pid)[0] for pid in live if pid not in final}
            for pid in (p for p in live if p not in final):  # 1. restore
                state = states.get(pid)
                if state == ProcessState.FAILED:
                    final[pid] = f"pid {pid} {FAILED_WORDS}"
                elif state == ProcessState.CHECKPOINTED and pid in refused:
                    final[pid] = refused[pid]
                elif state == ProcessState.CHECKPOINTED:
                    try:
                        calls.restore(pid, held.get(pid, 0))
                    except GpuError as e:
                        if not _tolerated(e, pid in guessed):
                            errors[pid].append(str(e))
                        if isinstance(e, CudaError) and e.code in FINAL_RESULTS:
                            final[pid] = ""
            for pid in (p for p in live if p not in final):  # 2. unlock
                state, _ = ask_state(calls, pid)
                if state == ProcessState.LOCKED or (state is None and pid in guessed):
                    try:
                        calls.unlock(pid)
                    except GpuError as e:
                        if not _tolerated(e, pid in guessed):
                            errors[pid].append(str(e))
                        if isinstance(e, CudaError) and e.code in FINAL_RESULTS:
                            final[pid] = ""
            if all(ask_state(calls, pid)[0] == ProcessState.RUNNING for pid in live
                   if pid not in final):
                break
        for pid in live:  # 3. where each is left
            if final.get(pid):
                continue
            state, unknown = ask_state(calls, pid)
            if state == ProcessState.RUNNING:
                final.pop(pid, None)
                continue
            if state == ProcessState.FAILED:
                errors[pid].append(f"pid {pid} {FAILED_WORDS}")
            elif state is None:
                errors[pid].append(f"pid {pid}: its GPU state is unknown ({unknown})")
            else:
                errors[pid].append(f"pid {pid} is left {state.name}")
            final[pid] = "; ".join(dict.fromkeys(errors[pid]))
    failures = [final[pid] for pid in live if final.get(pid)]
    for failure in failures:
        log.error(f"GPU resume: {failure}")
    return failures


class _Resume:
    """The undo of a GPU suspension, for an ExitStack (push): resume everything; after a
    successful block, fail loudly if a process could not be resumed."""

    def __init__(self, cfg: Config, worker: DriverWorker, pids: list[int], log: Log,
                 cgroup: Cgroup, recorded: GpuInventory | None,
                 assumed: dict[int, ProcessState], on_thawed: Callable[[bool], None]) -> None:
        self.cfg, self.worker, self.pids, self.log = cfg, worker, pids, log
        self.cgroup, self.recorded, self.assumed = cgroup, recorded, assumed
        self.on_thawed = on_thawed

    def __call__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        paused = os.path.isdir(self.cgroup.path) and self.cgroup.is_frozen()
        if paused:
            self.on_thawed(True)
        try:
            failures = resume(self.cfg, self.worker, self.pids, self.log, self.cgroup,
                              self.recorded, self.assumed)
        finally:
            if paused:
                self.on_thawed(False)
        if failures and exc_type is None:
            raise GpuError("the checkpoint was written, but the workload's GPU state could not be "
                           "resumed: " + "; ".join(failures),
                           hint="the CUDA processes named are left as said")
        return False


def find_cuda_processes(worker: DriverWorker, pids: list[int]) -> list[int]:
    """The pids the driver knows a restore thread for; GpuError for an answer that is neither
    yes nor "not a CUDA process" (a GPU container must not pass for a CPU-only one)."""
    found = []
    for pid in pids:
        try:
            if worker.restore_thread(pid) is not None:
                found.append(pid)
        except GpuError as e:
            if not os.path.exists(f"/proc/{pid}"):
                continue  # gone meanwhile
            raise GpuError(f"the CUDA driver cannot tell whether pid {pid} is a CUDA process: "
                           f"{e}", hint="nothing was locked; the container keeps running. Run "
                           "torpor-runc as root, and see that persistence mode is on "
                           "(`nvidia-smi -pm 1`) and the driver answers `nvidia-smi`") from None
    return found


RUNTIME_UVM_WINDOW = 2 << 20  # every CUDA process maps one of these (seen on 580.159.04)


def managed_memory(pid: int, gpus: int = 0) -> int:
    """Bytes of UVM managed memory (cudaMallocManaged) pid maps, as far as its mappings tell.

    Every CUDA process maps /dev/nvidia-uvm: the CUDA runtime's own 2 MiB window (PyTorch 2.11
    and CuPy 14 on one H200, driver 580.159.04), which the driver checkpoints like any other.
    A managed allocation adds a mapping of its own size (1 GiB of CuPy managed memory: one
    more mapping of 1 GiB; 2 MiB of it: a second 2 MiB mapping). So every mapping of another
    size counts, and so do windows beyond one per GPU the process sees (`gpus`; 0: unknown,
    none counted): whether a process on several GPUs maps one window or one per GPU is not
    known, and either way it is not taken for managed memory. What this misses the driver
    refuses itself (CUDA_ERROR_NOT_SUPPORTED at checkpoint, the process left LOCKED on
    580.159.04), and torpor unlocks it."""
    total = windows = 0
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].rstrip("\n").removesuffix(
                        " (deleted)").endswith("/nvidia-uvm"):
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    if end - start == RUNTIME_UVM_WINDOW:
                        windows += 1
                    else:
                        total += end - start
    except (OSError, ValueError):
        return 0
    if gpus > 0:
        total += max(0, windows - gpus) * RUNTIME_UVM_WINDOW
    return total


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n < 1 << 30 else inventory.gib(n)


def is_stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        return text[text.rindex(")") + 2:][:1] == "T"
    except (OSError, ValueError):
        return False


def _unsupported(worker: DriverWorker, pids: list[int], recorded: GpuInventory | None,
                 seen: ContainerGpus | None) -> list[str]:
    """Every reason these processes cannot be checkpointed, found before any lock."""
    problems = []
    for pid in pids:
        state, why = ask_state(worker, pid)
        if state is None:
            problems.append(f"the driver does not tell the checkpoint state of pid {pid}: {why}")
        elif state == ProcessState.FAILED:
            problems.append(f"pid {pid} {FAILED_WORDS}")
        elif state != ProcessState.RUNNING:
            problems.append(f"pid {pid} is already {state.name} by the driver (someone else, "
                            "such as cuda-checkpoint, is checkpointing it): torpor leaves it be")
    for g in seen.gpus if seen else ():
        if g.mig_mode == "on":
            problems.append(f"GPU {g.index} ({g.uuid}) has MIG enabled, which CUDA checkpoints "
                            "do not support")
    mps = worker.mps_clients(pids)
    if mps:
        problems.append(f"pids {', '.join(map(str, mps))} are clients of an MPS server, which "
                        "CUDA checkpoints do not support")
    gpus = len(seen.gpus) if seen else 0
    managed = {pid: n for pid in pids if (n := managed_memory(pid, gpus))}
    if managed:
        problems.append("UVM managed memory (cudaMallocManaged), which CUDA checkpoints do not "
                        "support, in " + ", ".join(f"pid {pid} ({_mib(n)} mapped from "
                                                   "/dev/nvidia-uvm)"
                                                   for pid, n in managed.items()))
    if recorded is not None:
        problems.extend(m for m in (compat.partial_passthrough_refusal(recorded, seen,
                                                                       "checkpoint"),) if m)
    return problems


def _lock(worker: DriverWorker, pid: int, timeout_ms: int) -> None:
    try:
        worker.lock(pid, timeout_ms)
    except CudaError as e:
        if e.code != cuda.NOT_READY:
            raise
        raise GpuError(f"pid {pid} could not be locked within {timeout_ms} ms: its CUDA work did "
                       "not reach a point where it can stop (CUDA_ERROR_NOT_READY)",
                       hint="the container keeps running; retry, or raise [gpu] lock_timeout_ms "
                       "in the torpor config") from None


def _checkpoint(worker: DriverWorker, pid: int, held: int) -> None:
    try:
        worker.checkpoint(pid, held)
    except CudaError as e:
        if e.code == cuda.NOT_SUPPORTED:  # the process stays LOCKED (580.159.04); resume unlocks
            e.message += (": the driver does not checkpoint this process; it uses something CUDA "
                          "checkpoints do not support (UVM managed memory, MIG, MPS, CUDA IPC "
                          "or NCCL)")
        raise


def suspend_for_checkpoint(cfg: Config, cgroup: Cgroup, undo: contextlib.ExitStack, log: Log,
                           leave_running: bool, spec: OciSpec | None = None,
                           init_pid: int | None = None,
                           on_locked: Callable[[list[int]], None] = lambda pids: None,
                           on_call: OnCall = lambda pid, deadline: None,
                           on_thawed: Callable[[bool], None] = lambda thawed: None,
                           ) -> GpuState | None:
    """Lock, then checkpoint, the container's CUDA processes; `undo` resumes them. Returns
    what restore needs (None: no CUDA process, nothing to do). `on_thawed(True)` is told
    before a container its owner paused is thawed for the driver, `on_thawed(False)` once it
    is frozen again (the guardian must freeze it again should torpor-runc die meanwhile)."""
    if not driver_present(cfg):
        return None
    worker = new_worker(cfg, on_call)
    undo.callback(worker.close)
    assumed: dict[int, ProcessState] = {}
    paused = cgroup.is_frozen()
    if paused:
        on_thawed(True)
    try:
        with thawed(cgroup):
            cuda_pids = find_cuda_processes(worker, cgroup.pids())
            if not cuda_pids:
                return None
            refuse_criu_cuda_plugin()
            recorded = worker.inventory(cuda_pids)
            seen = visibility.container_gpus(recorded.gpus, spec, init_pid) if recorded else None
            problems = _unsupported(worker, cuda_pids, recorded, seen)
            if problems:
                raise GpuError("this container's GPU state cannot be checkpointed: "
                               + "; ".join(problems),
                               hint="nothing was locked; the container keeps running")
            if seen is not None and any(not g.persistence_mode for g in seen.gpus):
                worker.initialize()  # the resume will need it; failing now changes nothing
            version = worker.driver_version()
            processes = tuple(CudaProcess(pid=pid, ns_pid=ns_pid(pid)) for pid in cuda_pids)
            stopped = tuple(ns_pid(pid) for pid in cgroup.pids() if is_stopped(pid))
            held = held_bytes(recorded)
            try:
                for pid in cuda_pids:
                    assumed[pid] = ProcessState.LOCKED  # known before the call: it may lock anyway
                    on_locked(list(assumed))
                    _lock(worker, pid, cfg.gpu_lock_timeout_ms)
                for pid in cuda_pids:
                    assumed[pid] = ProcessState.CHECKPOINTED
                    _checkpoint(worker, pid, held.get(pid, 0))
            except BaseException as e:
                failures = resume(cfg, worker, list(assumed), log, recorded=recorded,
                                  assumed=assumed)
                if isinstance(e, GpuError):
                    e.message += ("; the CUDA processes were unlocked and keep running"
                                  if not failures else "; and the workload could not be resumed: "
                                  + "; ".join(failures))
                raise
    finally:
        if paused:
            on_thawed(False)
    undo.push(_Resume(cfg, worker, cuda_pids, log, cgroup, recorded, assumed, on_thawed))
    log.info(f"GPU: locked and checkpointed CUDA processes {cuda_pids}")
    return GpuState(cuda_driver_version=version, processes=processes, inventory=recorded,
                    visible_gpus=tuple(g.uuid for g in seen.gpus) if seen else (),
                    stopped_ns_pids=stopped)


def _wait_for_worker(pid: int, deadline: float) -> None:
    """The guardian: let torpor-runc's unfinished driver call end (until its deadline), so its
    effect is seen before anything is undone; then end it."""
    while pid and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1][:2] == " Z":
                    return  # ended, not yet reaped by its new parent
        except (OSError, IndexError):
            return
        time.sleep(0.02)
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def rollback(cfg: Config, pids: list[int], log: Log, worker_pid: int = 0,
             worker_deadline: float = 0.0) -> None:
    """From the guardian: torpor-runc died; put every process it may have locked back to
    running.

    containerd paused the task before the checkpoint and resumes it as soon as the runtime
    call fails. Thawing and freezing again around the driver calls at that moment would race
    with that resume (runc refuses to resume a task that is not paused, and containerd would
    keep it "paused"), so the owner gets a moment to thaw it first."""
    _wait_for_worker(worker_pid, worker_deadline)
    live = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    if not live or not driver_present(cfg):
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
    worker = new_worker(cfg)
    try:
        resume(cfg, worker, live, log, cgroup,
               assumed=dict.fromkeys(live, ProcessState.CHECKPOINTED))
    finally:
        worker.close()


__all__ = ["DriverTimeout", "resume", "rollback", "suspend_for_checkpoint"]
