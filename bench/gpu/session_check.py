"""torpor's own GPU checkpoint session (torpor.gpu.session) against a real driver, no CRIU.

    ./run.sh is the bench; this is:  python3 -m bench.gpu.session_check [--gib 2]

Three CUDA processes, each in a cgroup of its own as a container's would be, go through
suspend_for_checkpoint and its undo (what torpor-runc does around `runc checkpoint
--leave-running`), and each case states what a user must see:
  plain:   a PyTorch process holding N GiB is locked and checkpointed (its GPU memory in host
           memory, the driver says CHECKPOINTED), then restored and unlocked by the undo: its
           memory matches its pattern and it computes on;
  managed: a CuPy process with 1 GiB of UVM managed memory is refused before any lock, in
           words, and keeps running untouched;
  small:   a CuPy process with 2 MiB of managed memory, which torpor's look at the mappings
           may not tell from the CUDA runtime's own window: then the driver refuses the
           checkpoint (CUDA_ERROR_NOT_SUPPORTED), torpor unlocks it, and it keeps running whole.
Prints one JSON object per case and exits 1 if any case is not as stated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.gpu.run import Workload, kill
from torpor.capture.freezer import CGROUP_ROOT, Cgroup
from torpor.config import Config
from torpor.errors import GpuError
from torpor.gpu import cuda, session
from torpor.gpu.cuda import ProcessState

MANAGED = r"""
import sys, cupy
cupy.cuda.set_allocator(cupy.cuda.MemoryPool(cupy.cuda.malloc_managed).malloc)
x = cupy.full(int(sys.argv[1]) // 4, 7, dtype=cupy.int32); cupy.cuda.runtime.deviceSynchronize()
print("ready", flush=True)
for line in sys.stdin:
    print("ok" if bool((x == 7).all()) else "BAD", flush=True)
"""


class Printed:
    def debug(self, msg: str) -> None:
        pass

    def info(self, msg: str) -> None:
        print(f"  torpor: {msg}", file=sys.stderr)

    warning = error = info


def new_cgroup(name: str) -> Cgroup:
    v1 = os.path.join(CGROUP_ROOT, "freezer")
    path = os.path.join(v1 if os.path.isdir(v1) else CGROUP_ROOT, name)
    os.makedirs(path, exist_ok=True)
    return Cgroup(path, 1 if path.startswith(v1) else 2)


def remove(cgroup: Cgroup) -> None:
    for _ in range(100):
        try:
            os.rmdir(cgroup.path)
            return
        except OSError:
            time.sleep(0.05)


def join(cgroup: Cgroup, pid: int) -> None:
    Path(cgroup.path, "cgroup.procs").write_text(str(pid))


class ManagedProcess:
    def __init__(self, python: str, nbytes: int, cgroup: Cgroup) -> None:
        self.proc = subprocess.Popen([python, "-c", MANAGED, str(nbytes)], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        join(cgroup, self.proc.pid)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def whole(self) -> bool:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip() == "ok"


def uvm_mappings(pid: int) -> list[int]:
    """The sizes of pid's mappings of /dev/nvidia-uvm."""
    sizes = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if line.rstrip().endswith("/nvidia-uvm"):
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                sizes.append(end - start)
    return sizes


def suspend(cfg: Config, cgroup: Cgroup, undo: contextlib.ExitStack) -> tuple[Any, str]:
    try:
        state = session.suspend_for_checkpoint(cfg, cgroup, undo, Printed(), leave_running=True)
        return state, ""
    except GpuError as e:
        return None, str(e)


def plain(args: Any, cfg: Config, driver: cuda.CudaDriver) -> dict[str, Any]:
    cgroup = new_cgroup(f"torpor-gpu-check-plain-{os.getpid()}")
    work = Path(tempfile.mkdtemp(prefix="torpor-gpu-check-"))
    ns = argparse.Namespace(python=args.python, gib=args.gib, device="cuda")
    workload = Workload(ns, work, dict(os.environ))
    try:
        join(cgroup, workload.pid)
        workload.ready(600)
        before = workload.verify(600)["ok"]
        with contextlib.ExitStack() as undo:
            started = time.monotonic()
            state, error = suspend(cfg, cgroup, undo)
            suspended_s = time.monotonic() - started
            checkpointed = driver.state(workload.pid) == ProcessState.CHECKPOINTED
            started = time.monotonic()
        resumed_s = time.monotonic() - started
        running = driver.state(workload.pid) == ProcessState.RUNNING
        steps = workload.computing(1.0)
        after = workload.verify(600)["ok"]
        recorded = [p.pid for p in state.processes] if state else []
        ok = (not error and recorded == [workload.pid] and checkpointed and running and before
              and after and steps[1] > steps[0])
        return {"case": "plain", "ok": ok, "error": error, "recorded_pids": recorded,
                "managed_memory_seen": session.managed_memory(workload.pid, 1),
                "uvm_mappings": uvm_mappings(workload.pid),
                "checkpointed": checkpointed, "suspend_s": suspended_s, "resume_s": resumed_s,
                "running_after": running, "memory_whole": after, "computing": list(steps),
                "inventory": [f"{g.name} {g.uuid}" for g in state.inventory.gpus]
                if state and state.inventory else []}
    finally:
        kill(workload.pid)
        workload.proc.wait()
        remove(cgroup)


def managed(args: Any, cfg: Config, driver: cuda.CudaDriver, case: str,
            nbytes: int, expected: tuple[str, ...]) -> dict[str, Any]:
    cgroup = new_cgroup(f"torpor-gpu-check-{case}-{os.getpid()}")
    proc = ManagedProcess(args.python, nbytes, cgroup)
    try:
        seen = session.managed_memory(proc.proc.pid, 1)
        with contextlib.ExitStack() as undo:
            state, error = suspend(cfg, cgroup, undo)
        running = driver.state(proc.proc.pid) == ProcessState.RUNNING
        whole = proc.whole()
        ok = state is None and any(e in error for e in expected) and running and whole
        return {"case": case, "ok": ok, "managed_memory_seen": seen,
                "uvm_mappings": uvm_mappings(proc.proc.pid), "error": error,
                "running_after": running, "memory_whole": whole}
    finally:
        proc.proc.kill()
        proc.proc.wait()
        remove(cgroup)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args()
    cfg = Config()
    driver = cuda.CudaDriver.load(cfg.gpu_cuda_library)
    cases: list[Callable[[], dict[str, Any]]] = [
             lambda: plain(args, cfg, driver),
             lambda: managed(args, cfg, driver, "managed", 1 << 30, ("UVM managed memory",)),
             # refused by torpor if its mapping is larger than the window, else by the driver
             lambda: managed(args, cfg, driver, "small", 2 << 20,
                             ("UVM managed memory", "CUDA_ERROR_NOT_SUPPORTED"))]
    results = []
    for case in cases:
        try:
            results.append(case())
        except Exception:
            results.append({"ok": False, "failed": traceback.format_exc()})
        print(json.dumps(results[-1]), flush=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
