"""GPU checkpoint and restore through real containerd, runc and CRIU, with the fake driver.

A node of its own: its torpor config points [gpu] at the fake libraries and its containerd
(so the shim, so torpor-runc) carries TORPOR_FAKE_GPU_DIR. The workload, gpuworker, counts
only while the driver says it is RUNNING, so a process left locked shows as a stopped counter.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from torpor.gpu import cuda
from torpor.gpu.cuda import ProcessState

from ..gpu_fakes import A100, DRIVER_570, DRIVER_580, H200, Call, FakeLibs, FakeNode, counter, gpu
from ..support import images
from ..support.containerd import Node
from ..support.processes import kill_pid, wait_for

pytestmark = pytest.mark.real

GIB = 1 << 30
IMAGE = "localhost/torpor-test/gpuworker:1"
RUNTIME = ("--runtime", "io.containerd.torpor.v2")


@dataclass
class GpuNode:
    node: Node
    fake: FakeNode
    libs: FakeLibs
    state_dir: Path
    gpus: list[dict[str, object]]

    def driver(self) -> cuda.CudaDriver:
        """The fake driver, as this test process sees it (the `gpus` fixture points it here)."""
        return cuda.CudaDriver.load(str(self.libs.cuda))

    def state(self, pid: int) -> ProcessState:
        return self.driver().state(pid)

    def task_pid(self, name: str) -> int:
        for line in self.node.ctr("tasks", "ls").stdout.splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == name:
                return int(fields[1])
        raise AssertionError(f"no task {name}")

    def task_status(self, name: str) -> str:
        for line in self.node.ctr("tasks", "ls").stdout.splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == name:
                return fields[-1]
        return "NONE"

    def run(self, name: str, token: str, *args: str, memory: int = GIB, gpu_index: int = 0,
            children: int = 0, runtime: tuple[str, ...] = RUNTIME) -> int:
        """Start gpuworker (and `children` more CUDA processes, tokens TOKEN-N); its pid."""
        env = self.fake.process_env(token, gpu_index, memory)
        more = ("--children", str(children)) if children else ()
        self.node.ctr("run", "-d", *runtime, *[f"--env={k}={v}" for k, v in env.items()],
                      IMAGE, name, "/bin/gpuworker", *more, *args)
        pid = self.task_pid(name)
        tokens = [token, *(f"{token}-{n}" for n in range(1, children + 1))]
        wait_for(lambda: all(Path(f"/proc/{pid}/root/tmp/counter.{t}").exists() for t in tokens),
                 what="the workloads' counters")
        return pid

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """ctr against the node; a failure that was not expected shows torpor-runc's logs."""
        result = self.node.ctr(*args, check=False)
        if check and result.returncode != 0:
            logs = "".join(f"{p}:\n{p.read_text()[-4000:]}\n"
                           for p in self.node.root.glob("state/**/log.json"))
            raise AssertionError(f"ctr {' '.join(args)} failed:\n{result.stderr}\n{logs}")
        return result

    def remove(self, name: str) -> None:
        """Delete the task (a task whose restore failed is only deleted without --force)."""
        if self.task_status(name) in ("RUNNING", "PAUSED"):
            self.node.ctr("tasks", "delete", "--force", name, check=False)
        else:
            self.node.ctr("tasks", "delete", name, check=False)
        self.node.ctr("containers", "delete", name, check=False)

    def runc_knows(self, name: str) -> bool:
        """Does runc hold a container of that name (in containerd's runc root)?"""
        root = f"/run/containerd/runc/{self.node.namespace}"
        return subprocess.run(["runc", "--root", root, "state", name],
                              capture_output=True).returncode == 0

    def progressing(self, pid: int, token: str) -> bool:
        before, _ = counter(pid, token)
        time.sleep(0.3)
        after, state = counter(pid, token)
        return after > before and state == "R"

    def frozen(self, pid: int) -> bool:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "freezer" in controllers.split(","):
                state = Path(f"/sys/fs/cgroup/freezer{path}/freezer.state").read_text()
                return state.strip() != "THAWED"
        return False


@pytest.fixture(scope="module")
def gpu_image(session_dir: Path, fake_libs: FakeLibs) -> Path:
    layout = session_dir / "gpu-image-layout"
    images.write_layout(layout, IMAGE, {"bin/gpuworker": (fake_libs.worker.read_bytes(), 0o755)})
    return images.layout_tar(layout, session_dir / "gpu-image.tar")


@pytest.fixture(scope="module")
def gpu_node(nodes: object, session_dir: Path, fake_libs: FakeLibs,
             gpu_image: Path) -> GpuNode:
    fake = FakeNode(session_dir / "gpu-node")
    gpus = [gpu(H200, 0), gpu(H200, 1)]
    fake.configure(gpus)
    state_dir = session_dir / "gpu-torpor-state"
    config = session_dir / "gpu-torpor.toml"
    config.write_text(f'[runtime]\nstate_dir = "{state_dir}"\n\n[gpu]\n'
                      f'cuda_library = "{fake_libs.cuda}"\nnvml_library = "{fake_libs.nvml}"\n'
                      "lock_timeout_ms = 1500\n")
    node = nodes.start("gpu", config=config, extra_env=fake.env())  # type: ignore[attr-defined]
    node.ctr("images", "import", str(gpu_image))
    return GpuNode(node, fake, fake_libs, state_dir, gpus)


@pytest.fixture
def gpus(gpu_node: GpuNode, monkeypatch: pytest.MonkeyPatch) -> Iterator[GpuNode]:
    """The GPU node as configured at the start, whatever the test changes."""
    monkeypatch.setenv("TORPOR_FAKE_GPU_DIR", str(gpu_node.fake.dir))
    gpu_node.fake.configure(gpu_node.gpus)
    yield gpu_node
    gpu_node.fake.configure(gpu_node.gpus)


def ops(calls: list[Call]) -> list[tuple[str, int, str]]:
    return [(c.op, c.pid, c.fields["result"]) for c in calls
            if c.op in ("lock", "checkpoint", "restore", "unlock")]


def criu_window(log: Path) -> tuple[float, float]:
    """When CRIU ran, wall clock: its log's last write, minus the last relative timestamp."""
    end = log.stat().st_mtime
    stamps = re.findall(r"^\((\d+\.\d+)\)", log.read_text(errors="replace"), re.M)
    return end - float(stamps[-1]), end


def only(calls: list[Call], op: str) -> list[Call]:
    return [c for c in calls if c.op == op]


def test_gpu_checkpoint_comes_before_the_dump_and_resume_after(gpus: GpuNode,
                                                               container_name: str,
                                                               tmp_path: Path) -> None:
    """ctr t checkpoint, leave-running: lock all, checkpoint all, CRIU dump, restore all,
    unlock all; the paused container is thawed for the driver and every worker carries on."""
    name, token = container_name, "order"
    tokens = [token, f"{token}-1", f"{token}-2"]
    runc_binary = ("--runtime", "io.containerd.runc.v2", "--runc-binary",
                   str(gpus.node.bin_dir / "torpor-runc"))  # ctr passes --image-path for runc only
    init = gpus.run(name, token, children=2, memory=3 * GIB, runtime=runc_binary)
    images, work = tmp_path / "images", tmp_path / "work"
    gpus.ctr("tasks", "checkpoint", "--image-path", str(images), "--work-path", str(work), name)
    calls = sorted((c for t in tokens for c in gpus.fake.calls(token=t)),
                   key=lambda c: c.monotonic_ns)
    by_token = {t: gpus.fake.calls(token=t)[0].pid for t in tokens}
    assert init in by_token.values() and len(set(by_token.values())) == 3
    assert [c.op for c in calls if c.op in ("lock", "checkpoint", "restore", "unlock")] == (
        ["lock"] * 3 + ["checkpoint"] * 3 + ["restore"] * 3 + ["unlock"] * 3)
    assert all(c.result == 0 and c.fields["frozen"] == "0" for c in calls)
    dump_start, dump_end = criu_window(work / "dump.log")
    image_times = [p.stat().st_mtime for p in images.glob("*.img")]
    assert max(c.realtime for c in only(calls, "checkpoint")) < dump_start < min(image_times)
    assert min(c.realtime for c in only(calls, "restore")) > max(dump_end, *image_times)
    gpu_state = json.loads((images / "torpor-state.json").read_text())["gpu"]
    assert sorted(p["pid"] for p in gpu_state["processes"]) == sorted(by_token.values())
    assert [p["used_memory"] for p in gpu_state["inventory"]["processes"]] == [3 * GIB] * 3
    for t, pid in by_token.items():
        assert gpus.state(pid) == ProcessState.RUNNING
        assert gpus.progressing(pid, t), f"{t} stopped after the checkpoint"
    assert gpus.task_status(name) == "RUNNING" and not gpus.frozen(init)
    gpus.remove(name)


def test_checkpoint_and_restore_cuda_processes(gpus: GpuNode, container_name: str) -> None:
    """ctr c checkpoint, delete, ctr c restore --live: after CRIU restored the processes, GPU
    restore all then unlock all; every worker carries on from where the checkpoint was."""
    name, token = container_name, "restore"
    tokens = [token, f"{token}-1", f"{token}-2"]
    init = gpus.run(name, token, children=2, memory=3 * GIB)
    wait_for(lambda: all(counter(init, t)[0] > 30 for t in tokens), what="work done")
    seen = {t: counter(init, t)[0] for t in tokens}
    ref = f"localhost/torpor-test/checkpoint/{name}:1"
    gpus.ctr("containers", "checkpoint", "--task", name, ref)
    before = {c.pid for t in tokens for c in gpus.fake.calls(token=t)}
    gpus.remove(name)
    checkpointed = len(gpus.fake.calls())
    gpus.ctr("containers", "restore", "--live", name, ref)
    restored = gpus.task_pid(name)
    _, restore_end = criu_window(next(gpus.node.root.glob(f"**/{name}/restore.log")))
    after = [c for c in gpus.fake.calls()[checkpointed:] if c.fields.get("token") in tokens
             and c.op in ("restore", "unlock")]
    assert [c.op for c in after] == ["restore"] * 3 + ["unlock"] * 3
    assert all(c.result == 0 and c.pid not in before for c in after)
    assert "pairs" not in after[0].fields  # the same GPUs: the driver's default path
    assert min(c.realtime for c in after) > restore_end
    for t in tokens:
        value, _ = counter(restored, t)
        assert value >= seen[t], "the counter comes back from the checkpoint"
        assert gpus.progressing(restored, t)
    for pid in {c.pid for c in after}:
        assert gpus.state(pid) == ProcessState.RUNNING
    gpus.remove(name)


# A failed checkpoint leaves every CUDA process running, the container running and unfrozen.

FAILURES = {
    # case: (how to make it fail, what ctr must say)
    "lock-times-out": ("busy", "could not be locked within 1500 ms: its CUDA work did not reach "
                               "a point where it can stop (CUDA_ERROR_NOT_READY)"),
    "checkpoint-fails": ("checkpoint=999", "cuCheckpointProcessCheckpoint for pid {pid} failed: "
                         "CUDA_ERROR_UNKNOWN (999): unknown error; the CUDA processes were "
                         "unlocked and keep running"),
    "criu-dump-fails": ("--uring", "torpor: runc checkpoint failed (exit 1)"),
}


@pytest.mark.parametrize("case", FAILURES)
def test_a_failed_checkpoint_leaves_the_workload_running(gpus: GpuNode, container_name: str,
                                                         case: str) -> None:
    name, token = container_name, f"fail-{case}"
    second = f"{token}-1"
    how, message = FAILURES[case]
    init = gpus.run(name, token, *([how] if how.startswith("--") else []), children=1)
    if how == "busy":
        gpus.fake.set_busy(second)
    elif "=" in how:
        gpus.fake.inject(second, how)
    result = gpus.ctr("containers", "checkpoint", "--task", name,
                      f"localhost/torpor-test/checkpoint/{name}:1", check=False)
    gpus.fake.clear(second)
    pids = {t: gpus.fake.calls(token=t)[0].pid for t in (token, second)}
    assert result.returncode != 0
    assert message.format(pid=pids[second]) in result.stderr
    assert_running(gpus, name, init, pids)
    gpus.remove(name)


def assert_running(gpus: GpuNode, name: str, init: int, pids: dict[str, int]) -> None:
    wait_for(lambda: gpus.task_status(name) == "RUNNING", what="the task to run again")
    assert not gpus.frozen(init)
    for t, pid in pids.items():
        assert gpus.state(pid) == ProcessState.RUNNING, t
        assert gpus.progressing(pid, t), f"{t} is not making progress"


@pytest.mark.parametrize("rules", [("restore=999*1",), ("unlock=999*1",)])
def test_a_passing_driver_error_after_the_dump_is_retried(gpus: GpuNode, container_name: str,
                                                          rules: tuple[str, ...]) -> None:
    name, token = container_name, f"retry-{rules[0].split('=')[0]}"
    init = gpus.run(name, token)
    gpus.fake.inject(token, *rules)
    gpus.ctr("containers", "checkpoint", "--task", name, f"localhost/torpor-test/checkpoint/{name}:1")
    op = rules[0].split("=")[0]
    assert [c.result for c in gpus.fake.calls(op, token=token)] == [999, 0]
    assert_running(gpus, name, init, {token: init})
    gpus.remove(name)


def test_a_workload_left_locked_after_the_dump_is_an_error(gpus: GpuNode,
                                                           container_name: str) -> None:
    name, token = container_name, "stuck"
    init = gpus.run(name, token)
    gpus.fake.inject(token, "unlock=999")
    result = gpus.ctr("containers", "checkpoint", "--task", name,
                      f"localhost/torpor-test/checkpoint/{name}:1", check=False)
    assert result.returncode != 0
    assert ("the checkpoint was written, but the workload's GPU state could not be resumed: "
            f"cuCheckpointProcessUnlock for pid {init} failed: CUDA_ERROR_UNKNOWN (999)"
            ) in result.stderr
    assert gpus.state(init) == ProcessState.LOCKED
    assert not gpus.progressing(init, token)
    gpus.fake.clear(token)
    gpus.driver().unlock(init)
    assert_running(gpus, name, init, {token: init})
    gpus.remove(name)


def test_torpor_runc_killed_mid_checkpoint_is_undone_by_its_guardian(
        gpus: GpuNode, container_name: str) -> None:
    """containerd SIGKILLs a runtime whose request was cancelled: the guardian resumes the GPUs."""
    name, token = container_name, "killed"
    init = gpus.run(name, token, children=1)
    hold = gpus.state_dir / "test-hold" / "frozen"
    hold.parent.mkdir(parents=True, exist_ok=True)
    hold.touch()
    try:
        ctr = subprocess.Popen(
            ["ctr", "--address", gpus.node.address, "--namespace", gpus.node.namespace,
             "containers", "checkpoint", "--task", name, f"localhost/torpor-test/ck/{name}:1"],
            env=gpus.node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pid_file = Path(f"{hold}.pid")
        wait_for(pid_file.exists, timeout=60, what="torpor-runc to reach the frozen step")
        pids = {t: gpus.fake.calls(token=t)[0].pid for t in (token, f"{token}-1")}
        assert all(gpus.state(pid) == ProcessState.CHECKPOINTED for pid in pids.values())
        kill_pid(int(pid_file.read_text()))
        ctr.communicate(timeout=60)
        assert ctr.returncode != 0
    finally:
        hold.unlink(missing_ok=True)
        Path(f"{hold}.pid").unlink(missing_ok=True)
    wait_for(lambda: all(gpus.state(pid) == ProcessState.RUNNING for pid in pids.values()),
             timeout=15, what="the guardian to restore and unlock the GPUs")
    assert_running(gpus, name, init, pids)
    gpus.remove(name)


def test_restore_refuses_a_node_that_cannot_take_the_gpu_state(gpus: GpuNode,
                                                               container_name: str) -> None:
    """Every refusal names the mismatch, calls no GPU restore and leaves no task; a GPU restore
    that fails kills the restored task; GPUs of the same model with other UUIDs get pairs."""
    name, token = container_name, "refuse"
    gpus.run(name, token, memory=20 * GIB, gpu_index=1)
    ref = f"localhost/torpor-test/checkpoint/{name}:1"
    gpus.ctr("containers", "checkpoint", "--task", name, ref)
    gpus.remove(name)
    old = [dict(g) for g in gpus.gpus]
    crowded = dict(old[1], memory_used=int(old[1]["memory_total"]) - 10 * GIB)  # type: ignore
    other_uuids = [gpu(H200, 0), gpu(H200, 1)]
    refusals = [
        ([old[0]], None, "the checkpoint needs 2 GPU(s) (NVIDIA H200 (Hopper, compute capability "
                         "9.0)); this node has 1"),
        ([old[0], gpu(A100, 1)], None, "GPU 1 is a NVIDIA A100-SXM4-80GB (Ampere, compute "
                                       "capability 8.0); the checkpoint needs a NVIDIA H200"),
        (old, ("580.95.05", 13000), "this node has NVIDIA driver 580.95.05; the checkpoint was "
                                    "taken with 580.65.06: install the same driver version"),
        ([old[0], crowded], None, f"GPU 1 ({old[1]['uuid']}) has 10.0 GiB free; the "
                                  "checkpointed processes need 20.0 GiB on it"),
        ([old[0], dict(old[1], persistence=0)], None, "GPU 1 has persistence mode off"),
        ([old[0], dict(old[1], mig=1)], None, "GPU 1 has MIG enabled"),
        (other_uuids, DRIVER_570, "restoring onto other GPUs needs driver 580"),
    ]
    for node_gpus, driver, reason in refusals:
        gpus.fake.configure(node_gpus, driver or DRIVER_580)
        before = len(gpus.fake.calls())
        result = gpus.ctr("containers", "restore", "--live", name, ref, check=False)
        assert result.returncode != 0
        assert "this node cannot restore the checkpoint" in result.stderr
        assert reason in result.stderr, result.stderr
        assert not [c for c in gpus.fake.calls()[before:] if c.op in ("restore", "unlock")]
        assert gpus.task_status(name) == "CREATED"  # containerd's record of a task never started
        assert not gpus.runc_knows(name)
        gpus.remove(name)

    gpus.fake.configure(old)
    gpus.fake.inject(token, "restore=999")
    result = gpus.ctr("containers", "restore", "--live", name, ref, check=False)
    gpus.fake.clear(token)
    assert result.returncode != 0
    assert re.search(r"cuCheckpointProcessRestore for pid \d+ failed: CUDA_ERROR_UNKNOWN \(999\)",
                     result.stderr), result.stderr
    assert not gpus.runc_knows(name), "a restore whose GPU half failed leaves no container"
    gpus.remove(name)

    gpus.fake.configure(other_uuids)
    before = len(gpus.fake.calls())
    gpus.ctr("containers", "restore", "--live", name, ref)
    restored = gpus.task_pid(name)
    restore = [c for c in gpus.fake.calls()[before:] if c.op == "restore"]
    assert restore[-1].result == 0
    assert restore[-1].fields["pairs"] == ",".join(
        f"{o['uuid']}>{n['uuid']}" for o, n in zip(old, other_uuids, strict=True))
    assert f"gpu={other_uuids[1]['uuid']}" in (gpus.fake.dir / f"{token}.state").read_text()
    assert gpus.state(restored) == ProcessState.RUNNING
    assert gpus.progressing(restored, token)
    gpus.remove(name)
