"""torpor's CUDA driver binding: the struct layouts of cuda.h, then every call against the fake
driver, which keeps the real API's state machine and return codes."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torpor.errors import CudaError, GpuError
from torpor.gpu import cuda
from torpor.gpu.cuda import ProcessState

from ..gpu_fakes import DRIVER_570, H200, FakeLibs, FakeNode, gpu, progressing
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
    assert driver.is_cuda_process(proc.pid)
    assert driver.restore_thread_id(proc.pid) > 0
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
    assert driver.state(proc.pid) == ProcessState.RUNNING
    freezer.freeze(False)
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
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_DEVICE"):
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
    import os

    assert not driver.is_cuda_process(os.getpid())
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

