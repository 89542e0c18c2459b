"""torpor's GPU session against the fake driver, on host processes in a cgroup of the test's own:
thawing around the driver, the undo on an ExitStack, CRIU's cuda plugin, memory before resuming."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from torpor import config
from torpor.capture.freezer import Cgroup
from torpor.errors import GpuError, IncompatibleNode
from torpor.formats.gpu import CudaProcess, GpuState
from torpor.gpu import cuda, restore, session
from torpor.gpu.cuda import ProcessState

from ..gpu_fakes import FakeLibs, FakeNode, progressing
from .conftest import FreezerCgroup, Worker

GIB = 1 << 30


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, msg: str) -> None:
        self.lines.append(("info", msg))

    def warning(self, msg: str) -> None:
        self.lines.append(("warning", msg))

    def error(self, msg: str) -> None:
        self.lines.append(("error", msg))


@pytest.fixture
def cfg(fake_libs: FakeLibs, tmp_path: Path) -> config.Config:
    return config.Config({"gpu": {"cuda_library": str(fake_libs.cuda),
                                  "nvml_library": str(fake_libs.nvml), "lock_timeout_ms": 300}},
                         str(tmp_path / "torpor.toml"))


def cgroup_of(freezer: FreezerCgroup) -> Cgroup:
    return Cgroup(str(freezer.path), 1 if freezer.v1 else 2)


def test_a_paused_container_is_thawed_for_the_driver_and_frozen_again(
        cfg: config.Config, cuda_process: Worker, freezer: FreezerCgroup, fake_node: FakeNode,
        driver: cuda.CudaDriver) -> None:
    procs = [cuda_process("s-a", memory=2 * GIB), cuda_process("s-b", memory=3 * GIB)]
    for p in procs:
        freezer.add(p.pid)
    cgroup = cgroup_of(freezer)
    cgroup.freeze()  # as containerd's pause
    log = Log()
    with contextlib.ExitStack() as undo:
        state = session.suspend_for_checkpoint(cfg, cgroup, undo, log, leave_running=True)
        assert cgroup.is_frozen()
        assert state is not None
        assert [p.pid for p in state.processes] == [p.pid for p in procs]
        assert state.inventory is not None
        assert [p.used_memory for p in state.inventory.processes] == [2 * GIB, 3 * GIB]
        assert state.visible_gpus == tuple(g["uuid"] for g in fake_node.gpus)
        assert all(mirrored(fake_node, t) == "CHECKPOINTED" for t in ("s-a", "s-b"))
    assert cgroup.is_frozen()
    assert all(mirrored(fake_node, t) == "RUNNING" for t in ("s-a", "s-b"))
    ops = [(c.op, c.fields["frozen"]) for c in fake_node.calls()
           if c.op in ("lock", "checkpoint", "restore", "unlock", "state")]
    assert [op for op, _ in ops if op != "state"] == [
        "lock", "lock", "checkpoint", "checkpoint", "restore", "restore", "unlock", "unlock"]
    assert {frozen for _, frozen in ops} == {"0"}  # state queries included: they would wait
    cgroup.thaw()
    assert all(driver.state(p.pid) == ProcessState.RUNNING for p in procs)
    assert progressing(procs[0].pid, "s-a")


def mirrored(node: FakeNode, token: str) -> str:
    """The state the fake last wrote for a token (asking the driver would wait while frozen)."""
    return (node.dir / f"{token}.state").read_text().split()[0].removeprefix("state=")


def test_no_cuda_process_means_no_gpu_state(cfg: config.Config, freezer: FreezerCgroup,
                                            fake_node: FakeNode) -> None:
    with contextlib.ExitStack() as undo:
        assert session.suspend_for_checkpoint(cfg, cgroup_of(freezer), undo, Log(), True) is None


def test_criu_cuda_plugin_is_refused_before_any_lock(
        cfg: config.Config, cuda_process: Worker, freezer: FreezerCgroup, fake_node: FakeNode,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, driver: cuda.CudaDriver) -> None:
    proc = cuda_process("s-plugin")
    freezer.add(proc.pid)
    plugins = tmp_path / "criu-plugins"
    plugins.mkdir()
    (plugins / "cuda_plugin.so").touch()
    monkeypatch.setenv("CRIU_LIBS_DIR", str(plugins))
    with pytest.raises(GpuError, match="CRIU's cuda plugin is installed"), \
            contextlib.ExitStack() as undo:
        session.suspend_for_checkpoint(cfg, cgroup_of(freezer), undo, Log(), True)
    assert not fake_node.calls("lock")
    assert driver.state(proc.pid) == ProcessState.RUNNING
    with pytest.raises(GpuError, match="CRIU's cuda plugin is installed"):
        restore.check_before_restore(cfg, GpuState(13000, (), None))


def test_a_process_that_would_not_fit_stays_checkpointed(
        cfg: config.Config, cuda_process: Worker, freezer: FreezerCgroup, fake_node: FakeNode,
        driver: cuda.CudaDriver) -> None:
    proc = cuda_process("s-room", memory=40 * GIB)
    freezer.add(proc.pid)
    log = Log()
    with pytest.raises(GpuError) as caught, contextlib.ExitStack() as undo:
        session.suspend_for_checkpoint(cfg, cgroup_of(freezer), undo, log, True)
        gpus = fake_node.gpus
        gpus[0]["memory_used"] = gpus[0]["memory_total"] - 10 * GIB  # someone took the GPU
        fake_node.configure(gpus)
    assert "the checkpoint was written, but the workload's GPU state could not be resumed" in str(
        caught.value)
    assert f"pid {proc.pid} stays checkpointed: it needs 40.0 GiB" in str(caught.value)
    assert not fake_node.calls("restore")  # never risked: an out-of-memory restore is for ever
    assert driver.state(proc.pid) == ProcessState.CHECKPOINTED
    gpus[0]["memory_used"] = 0
    fake_node.configure(gpus)
    session.rollback(cfg, [proc.pid], log)
    assert driver.state(proc.pid) == ProcessState.RUNNING


def test_no_driver_here_refuses_gpu_state(cfg: config.Config, tmp_path: Path) -> None:
    missing = config.Config({"gpu": {"cuda_library": str(tmp_path / "none.so")}})
    with pytest.raises(IncompatibleNode, match="this node has no CUDA driver"):
        restore.check_before_restore(missing, GpuState(13000, (CudaProcess(1, 1),), None))
    restore.check_before_restore(cfg, None)  # no GPU state: nothing to check
