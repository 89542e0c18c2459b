"""torpor's GPU bench: checkpoint and restore a PyTorch process holding N GiB on a GPU, with
torpor's CUDA driver binding around plain CRIU (no containerd), and the GB/s of each step.

    ./run.sh --gib 16                      in the bundle bench/gpu/package.sh makes
    python3 -m bench.gpu.run --gib 16      in a checkout (as root, CRIU on PATH)

 1. preflight (all --dry-run does): CRIU starts and `criu check` passes, the driver has the
    checkpoint API, the GPU has room, torch sees CUDA, host memory and the images directory fit;
 2. start the workload (bench/gpu/workload.py) and let it fill its memory and compute;
 3. verify its memory against the pattern;
 4. checkpoint: lock, checkpoint (GPU memory moves into the process's host memory), then
    `criu dump` of the process tree, which ends the process;
 5. restore: `criu restore --restore-detached`, then the driver's restore and unlock; with
    --lazy, `criu lazy-pages` serves the process's memory from the images over userfaultfd
    while it runs, so the driver's copy back to the GPU overlaps the host memory's arrival
    (the restore is complete when lazy-pages has placed the last page and exits);
 6. the time to the first answer: from the restore's start until the workload has computed a
    step on the GPU again; then verify again, and check that it computes on from where it was;
 7. report: seconds and GB/s (10^9 bytes of the process's GPU memory per second) per step.

CRIU runs with --no-default-config and CRIU_LIBS_DIR set to an empty directory, so a
cuda_plugin.so installed on the host cannot act beside torpor.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.gpu import preflight
from torpor.errors import CudaError
from torpor.gpu import cuda, inventory
from torpor.gpu.cuda import ProcessState

HERE = Path(__file__).resolve().parent
CRIU_FLAGS = ["--no-default-config", "-v4", "--shell-job", "--file-locks", "--link-remap"]
CRIUGPU_H100 = {"checkpoint": 0.7, "restore": 1.4}  # GB/s reported by CRIUgpu (arXiv 2502.16631)
DRIVER_CALL_TIMEOUT_S = 600.0


def wait_for(what: str, check: Any, timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"gpu bench: timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


class Workload:
    def __init__(self, args: Any, work: Path, env: dict[str, str]) -> None:
        self.work = work
        log = open(work / "workload.log", "ab")
        self.proc = subprocess.Popen(
            [args.python, str(HERE / "workload.py"), "--gib", str(args.gib), "--dir", str(work),
             "--device", args.device], cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.pid = self.proc.pid

    def status(self) -> dict[str, Any]:
        return read_json(self.work / "status.json") or {}

    def steps(self) -> int:
        return int(self.status().get("steps", 0))

    def ready(self, timeout: float) -> None:
        def filled() -> bool:
            status = self.status()
            return (status.get("phase") == "ready" and int(status.get("steps", 0)) > 0) or (
                self.proc.poll() is not None)

        wait_for("the workload to fill its memory", filled, timeout)
        if self.proc.poll() is not None:
            raise SystemExit(f"gpu bench: the workload exited: see {self.work}/workload.log")

    def verify(self, timeout: float) -> dict[str, Any]:
        result = self.work / "verify.json"
        result.unlink(missing_ok=True)
        (self.work / "verify.request").touch()
        return dict(wait_for("the workload to verify its memory", lambda: read_json(result),
                             timeout))

    def ask_ping(self) -> None:
        (self.work / "ping.json").unlink(missing_ok=True)
        (self.work / "ping.request").touch()

    def answered_at(self, timeout: float) -> float:
        """The wall-clock time of the workload's first computed step after ask_ping."""
        answer = wait_for("the workload's first answer",
                          lambda: read_json(self.work / "ping.json"), timeout, interval=0.001)
        return float(answer["time"])

    def computing(self, seconds: float = 2.0) -> tuple[int, int]:
        before = self.steps()
        time.sleep(seconds)
        return before, self.steps()


def criu(args: Any, env: dict[str, str], *argv: str) -> float:
    started = time.monotonic()
    proc = subprocess.run([args.criu, *argv], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"gpu bench: criu {argv[0]} failed (exit {proc.returncode}): "
                         f"{proc.stderr.strip()[-500:]}; see the log in {args.images}")
    return time.monotonic() - started


def timed(fn: Any, *a: Any) -> float:
    """Seconds fn(*a) took, in a thread of its own: a driver call that hangs (a lazily restored
    page that never comes, say) ends the bench with a message instead of hanging it."""
    failure: list[BaseException] = []

    def call() -> None:
        try:
            fn(*a)
        except BaseException as e:  # re-raised in the caller's thread
            failure.append(e)

    started = time.monotonic()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(DRIVER_CALL_TIMEOUT_S)
    if thread.is_alive():
        raise SystemExit(f"gpu bench: {getattr(fn, '__name__', fn)}{a} still running after "
                         f"{DRIVER_CALL_TIMEOUT_S:.0f}s")
    if failure:
        raise failure[0]
    return time.monotonic() - started


def driver_state(driver: cuda.CudaDriver, pid: int) -> ProcessState | None:
    try:
        return driver.state(pid)
    except CudaError:
        return None


class LazyPages:
    """`criu lazy-pages` serving a restore's memory from the images directory."""

    def __init__(self, args: Any, env: dict[str, str]) -> None:
        socket = Path(args.images) / "lazy-pages.socket"
        socket.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [args.criu, "lazy-pages", "-D", args.images, "-o", "lazy-pages.log",
             "--no-default-config", "-v4"], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for("criu lazy-pages to listen",
                 lambda: socket.exists() or self.proc.poll() is not None, 30, interval=0.005)
        if self.proc.poll() is not None:
            raise SystemExit(f"gpu bench: criu lazy-pages exited {self.proc.returncode}: "
                             f"see {args.images}/lazy-pages.log")

    def finished(self, timeout: float) -> float:
        """Wait for lazy-pages to have placed every page (it exits then); when, monotonic."""
        code = self.proc.wait(timeout)
        if code != 0:
            raise SystemExit(f"gpu bench: criu lazy-pages exited {code}: see its log")
        return time.monotonic()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def tree_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    wait_for(f"pid {pid} to end", lambda: not Path(f"/proc/{pid}").exists()
             or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3], 30)


def run(args: Any, criu_env: dict[str, str]) -> dict[str, Any]:
    driver = cuda.CudaDriver.load(args.cuda_library)
    inv = inventory.gather(args.nvml_library, args.cuda_library)
    nbytes = int(args.gib * (1 << 30)) // 4 * 4
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(args.gpu))
    if args.device == "fake":  # the fake driver's CUDA process (tests on CPU machines)
        env.update(FAKE_CUDA_TOKEN=f"gpu-bench-{os.getpid()}", FAKE_CUDA_MEM=str(nbytes),
                   FAKE_CUDA_STATE="R0" + inv.gpus[args.gpu].uuid)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.images, ignore_errors=True)
    os.makedirs(args.images)
    workload = Workload(args, work, env)
    pid, restored, lazy = workload.pid, False, None
    try:
        workload.ready(args.timeout)
        before = workload.verify(args.timeout)
        held = inventory.gather(args.nvml_library, args.cuda_library, [pid]).processes
        gpu_bytes = sum(p.used_memory for p in held) or nbytes
        facts = torpor_facts(driver, pid)
        steps_at_checkpoint = workload.steps()

        t: dict[str, float] = {"lock": timed(driver.lock, pid, args.lock_timeout_ms),
                               "gpu_checkpoint": timed(driver.checkpoint, pid)}
        assert driver.state(pid) == ProcessState.CHECKPOINTED
        t["criu_dump"] = criu(args, criu_env, "dump", "-t", str(pid), "-D", args.images,
                              "-o", "dump.log", *CRIU_FLAGS, *args.criu_arg)
        workload.proc.wait(60)  # CRIU ended it; reaped, its pid is free for the restore
        image_bytes = tree_bytes(args.images)

        if not inv.gpus[args.gpu].persistence_mode:
            driver.initialize()  # a restore needs persistence mode or cuInit
        pidfile = Path(args.images) / "restored.pid"
        workload.ask_ping()
        restore_wall, restore_began = time.time(), time.monotonic()
        if args.lazy:
            lazy = LazyPages(args, criu_env)
        t["criu_restore"] = criu(args, criu_env, "restore", "-D", args.images, "-o",
                                 "restore.log", "--restore-detached", "--pidfile", str(pidfile),
                                 *(["--lazy-pages"] if args.lazy else []),
                                 *CRIU_FLAGS, *args.criu_arg)
        pid, restored = int(pidfile.read_text()), True
        # the fake driver keeps its state in the process's memory, which a lazy restore may
        # not have placed yet; the real driver answers at once
        wait_for("the driver to see the restored process as checkpointed",
                 lambda: driver_state(driver, pid) == ProcessState.CHECKPOINTED, 60, 0.01)
        t["gpu_restore"] = timed(driver.restore, pid)
        t["unlock"] = timed(driver.unlock, pid)
        unlocked = time.monotonic()
        t["answer"] = workload.answered_at(args.timeout) - restore_wall
        t["complete"] = (lazy.finished(args.timeout) if lazy else unlocked) - restore_began
        steps_after = workload.computing()
        after = workload.verify(args.timeout)
    finally:
        if lazy:
            lazy.stop()
        if restored:
            kill(pid)
        elif workload.proc.poll() is None:
            workload.proc.kill()
            workload.proc.wait()
        if not args.keep:
            shutil.rmtree(args.images, ignore_errors=True)
    return report(args, gpu_bytes, image_bytes, t, before, after, steps_at_checkpoint,
                  steps_after, pid == workload.pid, facts)


def torpor_facts(driver: cuda.CudaDriver, pid: int) -> dict[str, Any]:
    """What torpor's checks make of a plain CUDA process, to verify them on hardware: the
    driver's restore thread (a thread of its own), and the UVM managed memory torpor sees in its
    mappings (it refuses a checkpoint of a process with any: 0 for a plain PyTorch process)."""
    from torpor.gpu.session import managed_memory

    tid = driver.restore_thread(pid)
    return {"restore_thread": tid, "restore_thread_is_own": tid is not None and tid != pid,
            "managed_memory": managed_memory(pid)}


def report(args: Any, gpu_bytes: int, image_bytes: int, t: dict[str, float],
           before: dict[str, Any], after: dict[str, Any], steps_at_checkpoint: int,
           steps_after: tuple[int, int], same_pid: bool,
           facts: dict[str, Any]) -> dict[str, Any]:
    gb = gpu_bytes / 1e9
    checkpoint_s = t["lock"] + t["gpu_checkpoint"] + t["criu_dump"]
    restore_s = max(t["criu_restore"] + t["gpu_restore"] + t["unlock"], t["complete"])
    return {
        "gpu_bytes": gpu_bytes, "image_bytes": image_bytes, "seconds": t,
        "mode": "lazy" if args.lazy else "eager",
        "checkpoint_s": checkpoint_s, "restore_s": restore_s, "answer_s": t["answer"],
        "checkpoint_gb_s": gb / checkpoint_s, "restore_gb_s": gb / restore_s,
        "gpu_checkpoint_gb_s": gb / t["gpu_checkpoint"], "gpu_restore_gb_s": gb / t["gpu_restore"],
        "criugpu_h100_gb_s": CRIUGPU_H100,
        "verified_before": before["ok"], "verified_after": after["ok"],
        "bad_chunks_after": after["bad_chunks"],
        "steps_at_checkpoint": steps_at_checkpoint, "steps_after_restore": list(steps_after),
        "computing_after_restore": steps_after[1] > steps_after[0] >= steps_at_checkpoint,
        "same_pid": same_pid, "device": args.device, "gib": args.gib, "torpor_facts": facts,
    }


def render(result: dict[str, Any]) -> str:
    t = result["seconds"]
    gb = result["gpu_bytes"] / 1e9
    lines = [f"GPU memory of the process: {gb:.2f} GB; CRIU images: "
             f"{result['image_bytes'] / 1e9:.2f} GB; restored {result['mode']}"]
    for step in ("lock", "gpu_checkpoint", "criu_dump", "criu_restore", "gpu_restore", "unlock"):
        lines.append(f"  {step:<15} {t[step]:8.3f} s")
    ref = result["criugpu_h100_gb_s"]
    lines += [
        f"checkpoint {result['checkpoint_s']:.2f} s = {result['checkpoint_gb_s']:.2f} GB/s "
        f"(CRIUgpu on H100: {ref['checkpoint']} GB/s)",
        f"restore    {result['restore_s']:.2f} s = {result['restore_gb_s']:.2f} GB/s "
        f"(CRIUgpu on H100: {ref['restore']} GB/s)",
        f"first answer {result['answer_s']:.2f} s after the restore began (a step computed on "
        f"the GPU); complete after {t['complete']:.2f} s",
        f"tensors match after restore: {result['verified_after']}; computing goes on: "
        f"{result['computing_after_restore']} (steps {result['steps_at_checkpoint']} at checkpoint,"
        f" {result['steps_after_restore'][0]} -> {result['steps_after_restore'][1]} after)",
    ]
    facts = result["torpor_facts"]
    lines.append(f"torpor's checks: restore thread {facts['restore_thread']} (a thread of its "
                 f"own: {facts['restore_thread_is_own']}); UVM managed memory seen: "
                 f"{facts['managed_memory']} bytes (torpor refuses a process with any)")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> Any:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--gib", type=float, default=16.0, help="GPU memory the workload holds")
    p.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to use")
    p.add_argument("--images", default="/dev/shm/torpor-gpu-bench", help="CRIU's images")
    p.add_argument("--work", default=None, help="the workload's files (default: a temp dir)")
    p.add_argument("--criu", default=os.environ.get("TORPOR_BENCH_CRIU", "criu"))
    p.add_argument("--criu-arg", action="append", default=[], help="one more CRIU flag")
    p.add_argument("--python", default=sys.executable, help="a Python that imports torch")
    p.add_argument("--cuda-library", default="libcuda.so.1")
    p.add_argument("--nvml-library", default="libnvidia-ml.so.1")
    p.add_argument("--lock-timeout-ms", type=int, default=10000)
    p.add_argument("--timeout", type=float, default=900, help="seconds for fill and verify")
    p.add_argument("--device", choices=("cuda", "fake"), default="cuda",
                   help="fake: host memory and torpor's fake driver (CPU-only tests)")
    p.add_argument("--json", default=None, help="also write the result here")
    p.add_argument("--keep", action="store_true", help="keep CRIU's images")
    p.add_argument("--lazy", action="store_true",
                   help="restore with `criu lazy-pages`: memory arrives while the process runs")
    p.add_argument("--dry-run", action="store_true", help="check the host and stop")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="torpor-criu-plugins-") as empty_plugins:
        return bench(args, dict(os.environ, CRIU_LIBS_DIR=empty_plugins))


def bench(args: Any, criu_env: dict[str, str]) -> int:
    pre = preflight.run(args, criu_env)
    print(json.dumps({"preflight": pre.facts, "problems": pre.problems, "notes": pre.notes},
                     indent=1))
    if args.dry_run or pre.problems:
        print(f"ready: {'no' if pre.problems else 'yes'}")
        return 1 if pre.problems else 0
    args.work = args.work or tempfile.mkdtemp(prefix="torpor-gpu-bench-")
    print(f"the workload's files: {args.work}")
    result = run(args, criu_env)
    print(render(result))
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps({"preflight": pre.facts, "result": result},
                                              indent=1))
    ok = result["verified_after"] and result["computing_after_restore"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
