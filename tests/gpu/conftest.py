"""GPU fixtures: the fake driver libraries (built once per session), a fake node per test, and
CUDA-process workloads started on the host and ended by pid."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from torpor.gpu import cuda

from ..gpu_fakes import H200, FakeLibs, FakeNode, build, gpu, start_worker
from ..support.processes import wait_for


@pytest.fixture(scope="session")
def fake_libs(session_dir: Path) -> FakeLibs:
    return build(session_dir / "gpu-fakes")


@pytest.fixture
def fake_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNode:
    """Two H200s on driver 580, seen by this test process's fake libraries."""
    node = FakeNode(tmp_path / "fake-gpu")
    node.configure([gpu(H200, 0), gpu(H200, 1)])
    monkeypatch.setenv("TORPOR_FAKE_GPU_DIR", str(node.dir))
    return node


@pytest.fixture
def driver(fake_libs: FakeLibs, fake_node: FakeNode) -> cuda.CudaDriver:
    return cuda.CudaDriver.load(str(fake_libs.cuda))


Worker = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def cuda_process(fake_libs: FakeLibs, fake_node: FakeNode) -> Iterator[Worker]:
    """Start gpuworker as a CUDA process on the host: (token, gpu_index=0, memory=1 GiB)."""
    started: list[tuple[subprocess.Popen[bytes], str]] = []

    def start(token: str, gpu_index: int = 0, memory: int = 1 << 30) -> subprocess.Popen[bytes]:
        proc = start_worker(fake_libs.worker, fake_node.process_env(token, gpu_index, memory))
        started.append((proc, token))
        counter = Path(f"/tmp/counter.{token}")
        wait_for(counter.exists, what=f"{counter}")
        return proc

    yield start
    for proc, token in started:
        proc.kill()
        proc.wait()
        Path(f"/tmp/counter.{token}").unlink(missing_ok=True)


class FreezerCgroup:
    """A cgroup v1 freezer (v2: cgroup.freeze) of our own, for processes the test started."""

    def __init__(self, name: str) -> None:
        v1 = Path("/sys/fs/cgroup/freezer")
        self.v1 = v1.is_dir()
        self.path = (v1 if self.v1 else Path("/sys/fs/cgroup")) / name
        self.path.mkdir()

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def freeze(self, frozen: bool = True) -> None:
        if self.v1:
            (self.path / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
        else:
            (self.path / "cgroup.freeze").write_text("1" if frozen else "0")

    def remove(self) -> None:
        self.freeze(False)
        parent = self.path.parent / "cgroup.procs"
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                parent.write_text(pid)
            except OSError:
                pass
        os.rmdir(self.path)


@pytest.fixture
def freezer() -> Iterator[FreezerCgroup]:
    cgroup = FreezerCgroup(f"torpor-test-gpu-{os.getpid()}")
    yield cgroup
    cgroup.remove()


__all__ = ["H200", "FakeNode", "gpu"]
