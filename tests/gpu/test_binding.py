"""torpor's CUDA driver binding: the struct layouts of cuda.h, then every call against the fake
driver, which keeps the real API's state machine and return codes."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torpor.errors import CudaError, GpuError
from torpor.gpu import cuda
from torpor.gpu.cuda import ProcessState

from ..gpu_fakes import DRIVER_570, H200, FakeLibs, FakeNode, gpu, progressing, start_worker
from ..support.processes import wait_for
from .conftest import FreezerCgroup, Worker

GIB = 1 << 30


@pytest.mark.parametrize("struct, field, offset, size", [
    (cuda.LockArgs, "timeoutMs", 0, 4),
    (cuda.LockArgs, "reserved0", 4, 4),
    (cuda.LockArgs, "reserved1", 8, 56),
    (cuda.CheckpointArgs, "reserved", 0, 64),
    (cuda.UnlockArgs, "reserved", 0, 64),
    (cuda.RestoreArgs, "gpuPairs", 0, 8),
    (cuda.RestoreArgs, "gpuPairsCount", 8, 4),
    (cuda.RestoreArgs, "reserved", 12, 44),
    (cuda.RestoreArgs, "reserved1", 56, 8),
    (cuda.GpuPair, "oldUuid", 0, 16),
    (cuda.GpuPair, "newUuid", 16, 16),
])
def test_struct_layout_is_cuda_h(struct: type[ctypes.Structure], field: str, offset: int,
                                 size: int) -> None:
    descriptor = getattr(struct, field)
    assert (descriptor.offset, descriptor.size) == (offset, size)


@pytest.mark.parametrize("struct, size", [
    (cuda.LockArgs, 64), (cuda.CheckpointArgs, 64), (cuda.UnlockArgs, 64),
    (cuda.RestoreArgs, 64), (cuda.GpuPair, 32)])
def test_struct_sizes_are_cuda_h(struct: type[ctypes.Structure], size: int) -> None:
    assert ctypes.sizeof(struct) == size


def test_uuid_text_becomes_the_16_raw_bytes() -> None:
    raw = cuda.uuid_bytes("GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9")
    assert raw == bytes.fromhex("0a1b2c3d4e5f60718293a4b5c6d7e8f9")
    with pytest.raises(GpuError, match="not a GPU UUID"):
        cuda.uuid_bytes("GPU-1234")


def test_state_machine_round_trip(driver: cuda.CudaDriver, cuda_process: Worker,
                                  fake_node: FakeNode) -> None:
    proc = cuda_process("round")
    assert driver.driver_version() == 13000
    tid = driver.restore_thread(proc.pid)
    assert tid is not None and tid != proc.pid  # the driver's own thread in the process
    assert Path(f"/proc/{proc.pid}/task/{tid}/comm").read_text().strip() == "cuda-restore"
    assert driver.state(proc.pid) == ProcessState.RUNNING
    driver.lock(proc.pid, 1000)
    assert driver.state(proc.pid) == ProcessState.LOCKED
    assert not progressing(proc.pid, "round"), "a locked process must not make progress"
    driver.checkpoint(proc.pid)
    assert driver.state(proc.pid) == ProcessState.CHECKPOINTED
    driver.restore(proc.pid)
    assert driver.state(proc.pid) == ProcessState.LOCKED
    driver.unlock(proc.pid)
    assert driver.state(proc.pid) == ProcessState.RUNNING
    assert progressing(proc.pid, "round")
    ops = [(c.op, c.fields["before"], c.fields["after"], c.result)
           for c in fake_node.calls(token="round") if c.op not in ("state", "restore_tid")]
    assert ops == [("lock", "RUNNING", "LOCKED", 0),
                   ("checkpoint", "LOCKED", "CHECKPOINTED", 0),
                   ("restore", "CHECKPOINTED", "LOCKED", 0),
                   ("unlock", "LOCKED", "RUNNING", 0)]
    lock = fake_node.calls("lock", token="round")[0]
    assert lock.fields["timeout_ms"] == "1000"


@pytest.mark.parametrize("steps, wrong", [
    ((), "checkpoint"), ((), "restore"), ((), "unlock"),
    (("lock",), "lock"), (("lock",), "restore"),
    (("lock", "checkpoint"), "lock"), (("lock", "checkpoint"), "unlock"),
])
def test_wrong_state_is_illegal_state_with_the_drivers_words(
        driver: cuda.CudaDriver, cuda_process: Worker, steps: tuple[str, ...],
        wrong: str) -> None:
    proc = cuda_process("wrong")
    for step in steps:
        getattr(driver, step)(proc.pid, *([500] if step == "lock" else []))
    before = driver.state(proc.pid)
    with pytest.raises(CudaError) as caught:
        getattr(driver, wrong)(proc.pid, *([500] if wrong == "lock" else []))
    error = caught.value
    assert (error.code, error.name, error.pid) == (401, "CUDA_ERROR_ILLEGAL_STATE", proc.pid)
    assert f"for pid {proc.pid} failed: CUDA_ERROR_ILLEGAL_STATE (401): the operation cannot " \
           "be performed in the present state" in str(error)
    assert error.operation.startswith(f"cuCheckpointProcess{wrong.capitalize()}")
    assert driver.state(proc.pid) == before


def test_state_lives_across_separate_processes(fake_libs: FakeLibs, cuda_process: Worker,
                                               driver: cuda.CudaDriver) -> None:
    proc = cuda_process("across")
    script = ("import sys; from torpor.gpu import cuda; d = cuda.CudaDriver.load(sys.argv[1]); "
              "pid = int(sys.argv[2]); getattr(d, sys.argv[3])(pid, *map(int, sys.argv[4:])); "
              "print(d.state(pid).name)")
    for step, args, expected in (("lock", ["1000"], "LOCKED"), ("checkpoint", [], "CHECKPOINTED")):
        out = subprocess.run([sys.executable, "-c", script, str(fake_libs.cuda), str(proc.pid),
                              step, *args], check=True,
                             capture_output=True, text=True).stdout.strip()
        assert out == expected
        assert driver.state(proc.pid).name == expected
    driver.restore(proc.pid)
    driver.unlock(proc.pid)
    assert driver.state(proc.pid) == ProcessState.RUNNING


def test_lock_times_out_with_not_ready_on_a_busy_process(driver: cuda.CudaDriver,
                                                         cuda_process: Worker,
                                                         fake_node: FakeNode) -> None:
    proc = cuda_process("busy")
    fake_node.set_busy("busy")
    started = time.monotonic()
    with pytest.raises(CudaError) as caught:
        driver.lock(proc.pid, 300)
    assert time.monotonic() - started >= 0.3
    assert (caught.value.code, caught.value.name) == (600, "CUDA_ERROR_NOT_READY")
    assert driver.state(proc.pid) == ProcessState.RUNNING
    fake_node.set_busy("busy", False)
    driver.lock(proc.pid, 300)
    driver.unlock(proc.pid)


def test_lock_of_a_frozen_process_times_out_and_works_once_thawed(
        driver: cuda.CudaDriver, cuda_process: Worker, freezer: FreezerCgroup) -> None:
    proc = cuda_process("frozen")
    freezer.add(proc.pid)
    freezer.freeze()
    with pytest.raises(CudaError, match="CUDA_ERROR_NOT_READY"):
        driver.lock(proc.pid, 200)
    freezer.freeze(False)  # (a state query would wait while it is frozen)
    assert driver.state(proc.pid) == ProcessState.RUNNING
    driver.lock(proc.pid, 200)
    assert driver.state(proc.pid) == ProcessState.LOCKED
    driver.unlock(proc.pid)


def test_restore_without_room_is_out_of_memory_then_operating_system_for_ever(
        driver: cuda.CudaDriver, cuda_process: Worker, fake_node: FakeNode) -> None:
    proc = cuda_process("oom", memory=40 * GIB)
    driver.lock(proc.pid, 1000)
    driver.checkpoint(proc.pid)
    gpus = fake_node.gpus
    gpus[0]["memory_used"] = gpus[0]["memory_total"] - 10 * GIB  # someone took the GPU
    fake_node.configure(gpus)
    with pytest.raises(CudaError) as first:
        driver.restore(proc.pid)
    assert (first.value.code, first.value.name) == (2, "CUDA_ERROR_OUT_OF_MEMORY")
    gpus[0]["memory_used"] = 0
    fake_node.configure(gpus)
    for _ in range(2):
        with pytest.raises(CudaError) as again:
            driver.restore(proc.pid)
        assert (again.value.code, again.value.name) == (304, "CUDA_ERROR_OPERATING_SYSTEM")
    with pytest.raises(CudaError, match="CUDA_ERROR_ILLEGAL_STATE"):
        driver.unlock(proc.pid)
    assert driver.state(proc.pid) == ProcessState.CHECKPOINTED


def test_restore_onto_other_gpus_needs_pairs_and_driver_580(
        driver: cuda.CudaDriver, cuda_process: Worker, fake_node: FakeNode) -> None:
    proc = cuda_process("pairs", gpu_index=1)
    old = fake_node.gpus[1]["uuid"]
    driver.lock(proc.pid, 1000)
    driver.checkpoint(proc.pid)
    fake_node.configure([gpu(H200, 0), gpu(H200, 1)])  # the "same" node, other GPUs
    with pytest.raises(CudaError, match="CUDA_ERROR_NOT_SUPPORTED"):
        driver.restore(proc.pid)
    new = fake_node.gpus[1]["uuid"]
    fake_node.configure(fake_node.gpus, DRIVER_570)
    with pytest.raises(GpuError, match="needs driver r580"):
        driver.restore(proc.pid, [(old, new)])
    assert not [c for c in fake_node.calls("restore", token="pairs") if "pairs" in c.fields]
    fake_node.configure(fake_node.gpus)
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):  # must cover its GPU
        driver.restore(proc.pid, [(fake_node.gpus[0]["uuid"], new)])
    driver.restore(proc.pid, [(fake_node.gpus[0]["uuid"], fake_node.gpus[0]["uuid"]),
                              (old, new)])
    driver.unlock(proc.pid)
    assert f"gpu={new}" in (fake_node.dir / "pairs.state").read_text()
    done = fake_node.calls("restore", token="pairs")[-1]
    assert f"{old}>{new}" in done.fields["pairs"]


def test_injected_failures_and_names_of_unknown_results(
        driver: cuda.CudaDriver, cuda_process: Worker, fake_node: FakeNode) -> None:
    proc = cuda_process("inject")
    fake_node.inject("inject", "lock=12345*1", "checkpoint=999!")
    with pytest.raises(CudaError) as unknown:
        driver.lock(proc.pid, 100)
    assert (unknown.value.name, unknown.value.code) == ("CUresult 12345", 12345)
    driver.lock(proc.pid, 100)  # the injected failure was for one call only
    with pytest.raises(CudaError, match="CUDA_ERROR_UNKNOWN \\(999\\): unknown error"):
        driver.checkpoint(proc.pid)
    assert driver.state(proc.pid) == ProcessState.FAILED


def test_non_cuda_process_and_missing_or_old_libraries(driver: cuda.CudaDriver,
                                                       tmp_path: Path) -> None:
    assert driver.restore_thread(os.getpid()) is None
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        driver.state(os.getpid())
    assert cuda.CudaDriver.load_or_none(str(tmp_path / "libcuda.so.1")) is None
    with pytest.raises(GpuError, match="cannot load the CUDA driver library"):
        cuda.CudaDriver.load(str(tmp_path / "libcuda.so.1"))
    with pytest.raises(GpuError, match="needs driver r570"):
        cuda.CudaDriver.load("libc.so.6")


def test_no_driver_configured_is_not_initialized(fake_libs: FakeLibs,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORPOR_FAKE_GPU_DIR", raising=False)
    with pytest.raises(CudaError, match="CUDA_ERROR_NOT_INITIALIZED"):
        cuda.CudaDriver.load(str(fake_libs.cuda)).driver_version()



def run_call(fake_libs: FakeLibs, call: str, *args: str, timeout: float = 5
             ) -> subprocess.Popen[str]:
    """A driver call in a process of its own (cuInit, and calls that block, stay there)."""
    script = ("import sys; from torpor.gpu import cuda; d = cuda.CudaDriver.load(sys.argv[1]); "
              "args = sys.argv[3:]; [d.initialize() for _ in range(args.count('--init'))]; "
              "args = [a for a in args if a != '--init']; "
              "r = getattr(d, sys.argv[2])(*map(int, args)); print(r if r is None else int(r))")
    return subprocess.Popen([sys.executable, "-c", script, str(fake_libs.cuda), call, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_restore_needs_persistence_mode_or_cuinit_in_the_caller(
        fake_libs: FakeLibs, cuda_process: Worker, fake_node: FakeNode,
        driver: cuda.CudaDriver) -> None:
    """"CUDA process restore requires persistence mode to be enabled or cuInit to have been
    called before execution" (the Driver API reference)."""
    fake_node.configure([gpu(H200, 0, persistence=0), gpu(H200, 1)])
    proc = cuda_process("persist")
    driver.lock(proc.pid, 1000)
    driver.checkpoint(proc.pid)
    without = run_call(fake_libs, "restore", str(proc.pid))
    assert without.wait(10) != 0 and "CUDA_ERROR_NOT_INITIALIZED" in without.communicate()[1]
    assert driver.state(proc.pid) == ProcessState.CHECKPOINTED
    with_init = run_call(fake_libs, "restore", "--init", str(proc.pid))
    assert with_init.wait(10) == 0, with_init.communicate()
    assert driver.state(proc.pid) == ProcessState.LOCKED
    driver.unlock(proc.pid)


def test_state_queries_block_while_the_restore_thread_is_frozen(
        fake_libs: FakeLibs, cuda_process: Worker, freezer: FreezerCgroup) -> None:
    """"State queries can block while the CUDA restore thread is frozen" (CRIU's cuda plugin);
    the restore-thread query does not."""
    proc = cuda_process("blocking")
    freezer.add(proc.pid)
    freezer.freeze()
    tid = run_call(fake_libs, "restore_thread", str(proc.pid))
    assert tid.wait(10) == 0
    query = run_call(fake_libs, "state", str(proc.pid))
    time.sleep(1.0)
    assert query.poll() is None, "a state query of a frozen process must wait, not fail"
    freezer.freeze(False)
    assert query.wait(10) == 0 and query.communicate()[0].strip() == "0"


def test_a_stopped_restore_thread_blocks_the_calls_that_need_it(
        fake_libs: FakeLibs, cuda_process: Worker, driver: cuda.CudaDriver) -> None:
    proc = cuda_process("stopped")
    tid = driver.restore_thread(proc.pid)
    driver.lock(proc.pid, 1000)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        call = run_call(fake_libs, "checkpoint", str(proc.pid))
        time.sleep(0.5)
        assert call.poll() is None
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert call.wait(10) == 0
    assert tid is not None and driver.state(proc.pid) == ProcessState.CHECKPOINTED
    driver.restore(proc.pid)
    driver.unlock(proc.pid)


def test_some_setups_answer_every_restore_thread_query_with_304(
        driver: cuda.CudaDriver, cuda_process: Worker, fake_node: FakeNode) -> None:
    proc = cuda_process("oscall")
    fake_node.configure(fake_node.gpus, restore_tid_error=304)
    for pid in (proc.pid, os.getpid()):
        with pytest.raises(CudaError) as caught:
            driver.restore_thread(pid)
        assert (caught.value.code, caught.value.name) == (304, "CUDA_ERROR_OPERATING_SYSTEM")


def test_a_failed_lock_can_have_locked(driver: cuda.CudaDriver, cuda_process: Worker,
                                       fake_node: FakeNode) -> None:
    """CRIU: "CUDA lock failed but pid %d is locked; unlocking it"."""
    proc = cuda_process("halflock")
    fake_node.inject("halflock", "lock=999+*1")
    with pytest.raises(CudaError, match="CUDA_ERROR_UNKNOWN"):
        driver.lock(proc.pid, 1000)
    assert driver.state(proc.pid) == ProcessState.LOCKED
    driver.unlock(proc.pid)


def test_a_process_on_two_gpus_needs_pairs_for_both(
        driver: cuda.CudaDriver, fake_libs: FakeLibs, fake_node: FakeNode) -> None:
    """One GPU holds its memory, the other it only sees: NVML lists it on the first only, the
    driver checkpoints both, and pairs "must contain every checkpointed GPU"."""
    from torpor.gpu import inventory

    proc = start_worker(fake_libs.worker,
                        fake_node.process_env("two", memory=[3 * GIB, 0], gpus=[0, 1]))
    try:
        wait_for(Path("/tmp/counter.two").exists, what="the worker")
        old = [g["uuid"] for g in fake_node.gpus]
        listed = inventory.gather(str(fake_libs.nvml), str(fake_libs.cuda), [proc.pid]).processes
        assert [(p.gpu_uuid, p.used_memory) for p in listed] == [(old[0], 3 * GIB)]
        driver.lock(proc.pid, 1000)
        driver.checkpoint(proc.pid)
        fake_node.configure([gpu(H200, 0), gpu(H200, 1)])
        new = [g["uuid"] for g in fake_node.gpus]
        with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
            driver.restore(proc.pid, [(old[0], new[0])])
        driver.restore(proc.pid, [(old[0], new[1]), (old[1], new[0])])
        driver.unlock(proc.pid)
        assert f"gpus={new[1]},{new[0]}" in (fake_node.dir / "two.state").read_text()
    finally:
        proc.kill()
        proc.wait()
        Path("/tmp/counter.two").unlink(missing_ok=True)


def test_what_the_driver_cannot_checkpoint(driver: cuda.CudaDriver, fake_libs: FakeLibs,
                                           fake_node: FakeNode, tmp_path: Path) -> None:
    """MIG, MPS and UVM managed memory are not supported (CRIU's cuda plugin README): the
    checkpoint answers NOT_SUPPORTED and leaves the process LOCKED, from where unlock resumes it
    (managed memory on an H200, driver 580.159.04). The CUDA runtime's own window of
    /dev/nvidia-uvm, which every CUDA process maps, is no managed memory."""
    fake_node.configure([gpu(H200, 0, mig=1), gpu(H200, 1)])
    cases = [("mig", fake_node.process_env("mig", 0), ()),
             ("mps", fake_node.process_env("mps", 1, mps=True), ()),
             ("uvm", fake_node.process_env("uvm", 1), ("--managed", str(tmp_path))),
             ("window", fake_node.process_env("window", 1), ("--uvm", str(tmp_path / "w")))]
    (tmp_path / "w").mkdir()
    procs = [start_worker(fake_libs.worker, env, *args) for _, env, args in cases]
    try:
        for (token, _, _), proc in zip(cases, procs, strict=True):
            wait_for(Path(f"/tmp/counter.{token}").exists, what=token)
            driver.lock(proc.pid, 1000)
            if token == "window":
                driver.checkpoint(proc.pid)
                driver.restore(proc.pid)
            else:
                with pytest.raises(CudaError, match="CUDA_ERROR_NOT_SUPPORTED"):
                    driver.checkpoint(proc.pid)
            assert driver.state(proc.pid) == ProcessState.LOCKED, token
            driver.unlock(proc.pid)
            assert driver.state(proc.pid) == ProcessState.RUNNING, token
    finally:
        for (token, _, _), proc in zip(cases, procs, strict=True):
            proc.kill()
            proc.wait()
            Path(f"/tmp/counter.{token}").unlink(missing_ok=True)


def test_driver_570_fails_on_a_process_given_only_some_gpus(
        driver: cuda.CudaDriver, cuda_process: Worker, fake_node: FakeNode) -> None:
    """"operation not permitted" (cuda-checkpoint issue 24), fixed in 575.57.08."""
    fake_node.configure(fake_node.gpus, DRIVER_570)
    proc = cuda_process("partial")
    driver.lock(proc.pid, 1000)
    with pytest.raises(CudaError, match="CUDA_ERROR_NOT_PERMITTED"):
        driver.checkpoint(proc.pid)
    fake_node.configure(fake_node.gpus, ("575.57.08", 12090))
    driver.checkpoint(proc.pid)
    driver.restore(proc.pid)
    driver.unlock(proc.pid)


def test_an_injected_hang_blocks(fake_libs: FakeLibs, cuda_process: Worker,
                                 fake_node: FakeNode) -> None:
    proc = cuda_process("hang")
    fake_node.inject("hang", "state=hang*1")
    call = run_call(fake_libs, "state", str(proc.pid))
    time.sleep(1.0)
    assert call.poll() is None
    call.kill()
    call.wait()
