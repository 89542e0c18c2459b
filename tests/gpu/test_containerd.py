"""GPU checkpoint and restore through real containerd, runc and CRIU, with the fake driver.

A node of its own: its torpor config points [gpu] at the fake libraries and its containerd
(so the shim, so torpor-runc) carries TORPOR_FAKE_GPU_DIR. The workload, gpuworker, counts
only while the driver says it is RUNNING, so a process left locked shows as a stopped counter.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from torpor.gpu import cuda
from torpor.gpu.cuda import ProcessState

from ..conftest import run_torpor
from ..gpu_fakes import (
    A100,
    DRIVER_570,
    DRIVER_580,
    H200,
    Call,
    FakeLibs,
    FakeNode,
    counter,
    device_node,
    gpu,
)
from ..support import images
from ..support.containerd import Node
from ..support.processes import kill_pid, reaped, wait_for

pytestmark = pytest.mark.real

GIB = 1 << 30
IMAGE = "localhost/torpor-test/gpuworker:1"
LOCK_TIMEOUT_MS = 1500
DRIVER_TIMEOUT_S = 2  # torpor's limit on one driver call, short for the tests of hangs
RUNTIME = ("--runtime", "io.containerd.torpor.v2")


@dataclass
class GpuNode:
    node: Node
    fake: FakeNode
    libs: FakeLibs
    state_dir: Path
    gpus: list[dict[str, object]]
    dev_dir: Path

    def driver(self) -> cuda.CudaDriver:
        """The fake driver, as this test process sees it (the `gpus` fixture points it here)."""
        return cuda.CudaDriver.load(str(self.libs.cuda))

    def state(self, pid: int) -> ProcessState:
        """The driver's state of pid, asked in a process of its own: the query waits while the
        process is frozen or stopped, as the driver's does."""
        script = ("import sys; from torpor.gpu import cuda; "
                  "print(int(cuda.CudaDriver.load(sys.argv[1]).state(int(sys.argv[2]))))")
        try:
            out = subprocess.run([sys.executable, "-c", script, str(self.libs.cuda), str(pid)],
                                 capture_output=True, text=True, timeout=5,
                                 env={**os.environ, **self.fake.env()})
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the driver's state query of pid {pid} waits: is it frozen "
                                 "or stopped?") from None
        if out.returncode != 0:
            raise AssertionError(f"state of pid {pid}: {out.stderr.strip()}")
        return ProcessState(int(out.stdout))

    def mirrored(self, token: str) -> str:
        """The state the fake last wrote for a token, without asking the driver."""
        return (self.fake.dir / f"{token}.state").read_text().split()[0].removeprefix("state=")

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

    def run(self, name: str, token: str, *args: str, memory: int | list[int] = GIB,
            gpu_index: int = 0, children: int = 0, runtime: tuple[str, ...] = RUNTIME,
            sees: list[int] | None = None, devices: tuple[int, ...] = (),
            mps: bool = False) -> int:
        """Start gpuworker (and `children` more CUDA processes, tokens TOKEN-N); its pid.
        `sees`: the GPUs (indices) its processes see, `memory` held on each; `devices`: the
        minors of the /dev/nvidiaN nodes bind-mounted into the container."""
        env = self.fake.process_env(token, gpu_index, memory, gpus=sees, mps=mps)
        more = ("--children", str(children)) if children else ()
        mounts = [f"--mount=type=bind,src={device_node(self.dev_dir, m)},dst=/dev/nvidia{m},"
                  "options=rbind:rw" for m in devices]
        self.node.ctr("run", "-d", *runtime, *[f"--env={k}={v}" for k, v in env.items()],
                      *mounts, IMAGE, name, "/bin/gpuworker", *more, *args)
        pid = self.task_pid(name)
        tokens = [token, *(f"{token}-{n}" for n in range(1, children + 1))]
        wait_for(lambda: all(Path(f"/proc/{pid}/root/tmp/counter.{t}").exists() for t in tokens),
                 what="the workloads' counters")
        return pid

    def ctr(self, *args: str, check: bool = True, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        """ctr against the node; a failure that was not expected shows torpor-runc's logs and
        the fake driver's last calls."""
        try:
            result = self.node.ctr(*args, check=False, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"ctr {' '.join(args)} did not end in {timeout} s\n"
                                 + self.diagnostics()) from None
        if check and result.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)} failed:\n{result.stderr}\n"
                                 + self.diagnostics())
        return result

    def diagnostics(self) -> str:
        logs = "".join(f"{p}:\n{p.read_text()[-4000:]}\n"
                       for p in self.node.root.glob("state/**/log.json"))
        try:
            calls = "\n".join((self.fake.dir / "calls.log").read_text().splitlines()[-25:])
        except OSError:
            calls = ""
        return f"{logs}\nthe fake driver's last calls:\n{calls}"

    def remove(self, name: str) -> None:
        """Delete the task (a task whose restore failed is only deleted without --force), and
        whatever runc still holds of it."""
        if self.task_status(name) in ("RUNNING", "PAUSED"):
            self.node.ctr("tasks", "delete", "--force", name, check=False)
        else:
            self.node.ctr("tasks", "delete", name, check=False)
        self.node.ctr("containers", "delete", name, check=False)
        if self.runc_knows(name):
            subprocess.run(["runc", "--root", f"/run/containerd/runc/{self.node.namespace}",
                            "delete", "--force", name], capture_output=True)

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
    config.write_text(f'[runtime]\nstate_dir = "{state_dir}"\nlog_dir = "{state_dir}-logs"\n\n[gpu]\n'
                      f'cuda_library = "{fake_libs.cuda}"\nnvml_library = "{fake_libs.nvml}"\n'
                      f"lock_timeout_ms = {LOCK_TIMEOUT_MS}\n"
                      f"driver_timeout_s = {DRIVER_TIMEOUT_S}\n")
    node = nodes.start("gpu", config=config, extra_env=fake.env())  # type: ignore[attr-defined]
    node.ctr("images", "import", str(gpu_image))
    return GpuNode(node, fake, fake_libs, state_dir, gpus, session_dir / "gpu-dev")


@pytest.fixture
def gpus(gpu_node: GpuNode, monkeypatch: pytest.MonkeyPatch,
         container_name: str) -> Iterator[GpuNode]:
    """The GPU node as configured at the start, whatever the test changes; the test's
    container is removed afterwards, even when the test failed."""
    monkeypatch.setenv("TORPOR_FAKE_GPU_DIR", str(gpu_node.fake.dir))
    gpu_node.fake.configure(gpu_node.gpus)
    yield gpu_node
    gpu_node.fake.configure(gpu_node.gpus)
    gpu_node.remove(container_name)


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
    restore all then unlock all, while every task is still stopped (CRIU's leave-stopped) and
    only the driver's restore threads run; then every process goes on: each worker from where
    the checkpoint was, and a process of the container that is no CUDA process."""
    name, token = container_name, "restore"
    tokens = [token, f"{token}-1", f"{token}-2"]
    # --uvm: like every CUDA process, the workers map the CUDA runtime's window of nvidia-uvm
    init = gpus.run(name, token, "--sleeper", "--uvm", "/tmp", children=2, memory=3 * GIB)
    sleeper = Path(f"/proc/{init}/root/tmp/sleeper.{token}")
    wait_for(sleeper.exists, what="the sleeper")
    sleeper_ns = int(sleeper.read_text())
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
    assert {c.fields["app"] for c in after} == {"stopped"}, \
        "the restored processes ran before their GPU state was back"
    for t in tokens:
        value, _ = counter(restored, t)
        assert value >= seen[t], "the counter comes back from the checkpoint"
        assert gpus.progressing(restored, t)
    for pid in {c.pid for c in after}:
        assert gpus.state(pid) == ProcessState.RUNNING
    assert stat_state(host_pid(restored, sleeper_ns)) == "S", "every process goes on"
    gpus.remove(name)


def test_a_lazy_restore_gives_the_gpu_copy_the_lazy_pace(gpus: GpuNode,
                                                        container_name: str) -> None:
    """`torpor restore --lazy` of a GPU container: the driver's restore runs while the page
    source still serves the memory (on an H200 the driver's copy back faults the host copy in
    through userfaultfd, bench/gpu --lazy), then unlock; the workers go on from the checkpoint."""
    name, token = container_name, "lazy-gpu"
    tokens = [token, f"{token}-1"]
    init = gpus.run(name, token, "--uvm", "/tmp", children=1, memory=2 * GIB)
    wait_for(lambda: all(counter(init, t)[0] > 30 for t in tokens), what="work done")
    ref = f"localhost/torpor-test/lazy-gpu/{name}:1"
    seen = {t: counter(init, t)[0] for t in tokens}
    run_torpor(gpus.node, "checkpoint", name, "-t", ref)   # it stops the container
    gpus.remove(name)
    before = len(gpus.fake.calls())
    done = json.loads(run_torpor(gpus.node, "restore", ref, "--name", name, "--lazy",
                                 "--json").stdout)
    assert done["timings"]["lazy_local_bytes"] > 0, done   # from this node's store, lazily
    assert [c.op for c in gpu_calls(gpus, before, *tokens)] == ["restore"] * 2 + ["unlock"] * 2
    restored = gpus.task_pid(name)
    for t in tokens:
        assert counter(restored, t)[0] >= seen[t], "the counter comes back from the checkpoint"
        assert gpus.progressing(restored, t)
    gpus.remove(name)


def host_pid(init: int, ns_pid: int) -> int:
    """The host pid of the container's process `ns_pid` (init's pid namespace)."""
    ns = os.readlink(f"/proc/{init}/ns/pid")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != ns:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        nspid = next(line.split()[-1] for line in status.splitlines()
                     if line.startswith("NSpid:"))
        if int(nspid) == ns_pid:
            return int(entry)
    raise AssertionError(f"no process {ns_pid} in the container of {init}")


def stat_state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2]


# A failed checkpoint leaves every CUDA process running, the container running and unfrozen:
# a failure injected at every step of the driver's, one that takes effect all the same, and a
# call that never returns (torpor's own deadline ends it, DRIVER_TIMEOUT_S in these tests).

KEEP_RUNNING = "; the CUDA processes were unlocked and keep running"
NOT_A_CUDA_ANSWER = "the CUDA driver cannot tell whether pid {pid} is a CUDA process: "
STATE_UNTOLD = "the driver does not tell the checkpoint state of pid {pid}: "
LOCK = "cuCheckpointProcessLock (timeout 1500 ms) for pid {pid} failed: "
CHECKPOINT = "cuCheckpointProcessCheckpoint for pid {pid} failed: "
UNKNOWN = "CUDA_ERROR_UNKNOWN (999): unknown error"


def no_answer(call: str, seconds: float) -> str:
    return (f"the NVIDIA driver did not answer {call} for pid {{pid}} within {seconds:g} s; "
            "torpor gave up on the call")


LOCK_LIMIT = DRIVER_TIMEOUT_S + LOCK_TIMEOUT_MS / 1000
COPY_LIMIT = DRIVER_TIMEOUT_S + 5  # 1 GiB held: 5 s more
FAILURES = {
    # case: (how to make the second process's step fail, what ctr must say)
    "restore-tid-fails": ("restore_tid=999", NOT_A_CUDA_ANSWER + "cuCheckpointProcessGetRestore"
                          "ThreadId for pid {pid} failed: " + UNKNOWN),
    "restore-tid-hangs": ("restore_tid=hang", NOT_A_CUDA_ANSWER + no_answer(
        "cuCheckpointProcessGetRestoreThreadId", DRIVER_TIMEOUT_S)),
    "state-fails": ("state=999", STATE_UNTOLD + "cuCheckpointProcessGetState for pid {pid} "
                    "failed: " + UNKNOWN),
    "state-hangs": ("state=hang*1", STATE_UNTOLD + no_answer("cuCheckpointProcessGetState",
                                                             DRIVER_TIMEOUT_S)),
    "lock-times-out": ("busy", "could not be locked within 1500 ms: its CUDA work did not reach "
                               "a point where it can stop (CUDA_ERROR_NOT_READY)"),
    "lock-fails": ("lock=999", LOCK + UNKNOWN + KEEP_RUNNING),
    "lock-fails-but-locks": ("lock=999+", LOCK + UNKNOWN + KEEP_RUNNING),
    "lock-hangs": ("lock=hang", no_answer("cuCheckpointProcessLock", LOCK_LIMIT)),
    "lock-locks-then-hangs": ("lock=hang+", no_answer("cuCheckpointProcessLock", LOCK_LIMIT)),
    "checkpoint-fails": ("checkpoint=999", CHECKPOINT + UNKNOWN + KEEP_RUNNING),
    "checkpoint-fails-but-checkpoints": ("checkpoint=999+", CHECKPOINT + UNKNOWN + KEEP_RUNNING),
    # what the driver refuses itself (a managed allocation torpor's look at the maps missed):
    # the process stays LOCKED (an H200 on 580.159.04) and is unlocked
    "checkpoint-not-supported": ("checkpoint=801", CHECKPOINT + "CUDA_ERROR_NOT_SUPPORTED (801): "
                                 "operation not supported: the driver does not checkpoint this "
                                 "process; it uses something CUDA checkpoints do not support "
                                 "(UVM managed memory, MIG, MPS, CUDA IPC or NCCL)"
                                 + KEEP_RUNNING),
    "checkpoint-hangs": ("checkpoint=hang*1", no_answer("cuCheckpointProcessCheckpoint",
                                                        COPY_LIMIT)),
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
    started = time.monotonic()
    result = gpus.ctr("containers", "checkpoint", "--task", name,
                      f"localhost/torpor-test/checkpoint/{name}:1", check=False)
    took = time.monotonic() - started
    gpus.fake.clear(second)
    pids = {t: pid_of(t) for t in (token, second)}
    assert result.returncode != 0
    assert message.format(pid=pids[second]) in result.stderr, result.stderr
    assert took < 30, "a hung driver must not hang containerd"
    assert_running(gpus, name, init, pids)
    gpus.remove(name)


@pytest.mark.parametrize("rule, results", [
    ("restore=999*1", ["999", "0"]), ("unlock=999*1", ["999", "0"]),
    ("restore=999+*1", ["999"]),  # it took effect: unlocked, not restored again
    ("restore=hang*1", ["0"]), ("unlock=hang*1", ["0"]),  # (a call that hangs logs nothing)
], ids=["restore-fails", "unlock-fails", "restore-fails-but-restores", "restore-hangs",
        "unlock-hangs"])
def test_a_passing_failure_after_the_dump_is_tried_again(gpus: GpuNode, container_name: str,
                                                         rule: str, results: list[str]) -> None:
    """After the dump (leave-running), restore and unlock are tried once more when the answer
    can change: an error, a restore that took effect all the same, a call that hung once."""
    name, token = container_name, f"retry-{rule.split('*')[0].replace('=', '-')}"
    init = gpus.run(name, token)
    gpus.fake.inject(token, rule)
    gpus.ctr("containers", "checkpoint", "--task", name, f"localhost/torpor-test/checkpoint/{name}:1")
    op = rule.split("=")[0]
    assert [c.fields["result"] for c in gpus.fake.calls(op, token=token)] == results
    assert_running(gpus, name, init, {token: init})
    gpus.remove(name)


def pids_of(token: str) -> list[int]:
    """The live processes of a fake CUDA process's token (host pids)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"FAKE_CUDA_TOKEN={token}".encode() in environ:
            found.append(int(entry))
    return found


def pid_of(token: str) -> int:
    found = pids_of(token)
    assert len(found) == 1, f"{token}: {found}"
    return found[0]


def assert_running(gpus: GpuNode, name: str, init: int, pids: dict[str, int]) -> None:
    try:
        wait_for(lambda: gpus.task_status(name) == "RUNNING", what="the task to run again")
    except TimeoutError:
        raise AssertionError(f"the task is {gpus.task_status(name)}, frozen: "
                             f"{gpus.frozen(init)}\n{gpus.diagnostics()}") from None
    assert not gpus.frozen(init)
    for t, pid in pids.items():
        assert gpus.state(pid) == ProcessState.RUNNING, t
        assert gpus.progressing(pid, t), f"{t} is not making progress"


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


@pytest.mark.parametrize("persistence", [1, 0], ids=["persistence-on", "persistence-off"])
def test_torpor_runc_killed_mid_checkpoint_is_undone_by_its_guardian(
        gpus: GpuNode, container_name: str, persistence: int) -> None:
    """containerd SIGKILLs a runtime whose request was cancelled: the guardian resumes the GPUs
    (with persistence mode off, after cuInit in its own worker)."""
    name, token = container_name, f"killed-{persistence}"
    gpus.fake.configure([dict(g, persistence=persistence) for g in gpus.gpus])
    init = gpus.run(name, token, children=1)
    hold = gpus.state_dir / "test-hold" / "frozen"
    hold.parent.mkdir(parents=True, exist_ok=True)
    hold.touch()
    try:
        with reaped() as started:
            ctr = subprocess.Popen(
                ["ctr", "--address", gpus.node.address, "--namespace", gpus.node.namespace,
                 "containers", "checkpoint", "--task", name, f"localhost/torpor-test/ck/{name}:1"],
                env=gpus.node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            started.append(ctr)
            pid_file = Path(f"{hold}.pid")
            wait_for(pid_file.exists, timeout=60, what="torpor-runc to reach the frozen step")
            pids = {t: gpus.fake.calls(token=t)[0].pid for t in (token, f"{token}-1")}
            assert all(gpus.mirrored(t) == "CHECKPOINTED" for t in pids)  # (it is frozen)
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
        ([old[0]], None, "the checkpoint's processes could see 2 GPU(s) (NVIDIA H200 (Hopper, "
                         "compute capability 9.0), NVIDIA H200 (Hopper, compute capability 9.0)) "
                         "and each must be restored onto one; this node has 1"),
        ([old[0], gpu(A100, 1)], None, "GPU 1 is a NVIDIA A100-SXM4-80GB (Ampere, compute "
                                       "capability 8.0); the checkpoint needs a NVIDIA H200"),
        (old, ("580.95.05", 13000), "this node has NVIDIA driver 580.95.05; the checkpoint was "
                                    "taken with 580.65.06: install the same driver version"),
        ([old[0], crowded], None, f"GPU 1 ({old[1]['uuid']}) has 10.0 GiB free; the "
                                  "checkpointed processes need 20.0 GiB on it"),
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


# The driver's behaviours that torpor once ignored (issue 14), one test each.

def checkpoint(gpus: GpuNode, name: str, check: bool = False
               ) -> subprocess.CompletedProcess[str]:
    return gpus.ctr("containers", "checkpoint", "--task", name,
                    f"localhost/torpor-test/checkpoint/{name}:1", check=check)


def gpu_calls(gpus: GpuNode, since: int, *tokens: str) -> list[Call]:
    return [c for c in gpus.fake.calls()[since:]
            if c.op in ("lock", "checkpoint", "restore", "unlock")
            and (not tokens or c.fields.get("token") in tokens)]


def test_persistence_mode_off_the_resume_calls_cuinit_first(gpus: GpuNode,
                                                            container_name: str) -> None:
    """"CUDA process restore requires persistence mode to be enabled or cuInit to have been
    called": with persistence mode off, torpor's driver worker calls cuInit (before the first
    lock, so that its failure would change nothing), and the leave-running resume works; a
    restore onto such a node works too."""
    name, token = container_name, "nopersist"
    gpus.fake.configure([dict(g, persistence=0) for g in gpus.gpus])
    init = gpus.run(name, token)
    before = len(gpus.fake.calls())
    checkpoint(gpus, name, check=True)
    calls = gpus.fake.calls()[before:]
    ops = [c.op for c in calls if c.op in ("cuInit", "lock", "restore")]
    assert ops[:2] == ["cuInit", "lock"] and "restore" in ops
    assert_running(gpus, name, init, {token: init})
    gpus.remove(name)
    before = len(gpus.fake.calls())
    gpus.ctr("containers", "restore", "--live", name, f"localhost/torpor-test/checkpoint/{name}:1")
    restored = gpus.task_pid(name)
    assert [c.op for c in gpus.fake.calls()[before:] if c.op in ("cuInit", "restore")][:2] == [
        "cuInit", "restore"]
    assert gpus.state(restored) == ProcessState.RUNNING and gpus.progressing(restored, token)
    gpus.remove(name)


def test_a_process_left_failed_is_named_not_said_to_keep_running(gpus: GpuNode,
                                                                  container_name: str) -> None:
    """CU_PROCESS_STATE_FAILED, "an uncorrectable error during the checkpoint/restore
    process": the error says which process is lost, and the others run on."""
    name, token = container_name, "failed"
    second = f"{token}-1"
    init = gpus.run(name, token, children=1)
    gpus.fake.inject(second, "checkpoint=999!")
    result = checkpoint(gpus, name)
    gpus.fake.clear(second)
    lost = pid_of(second)
    assert result.returncode != 0
    assert (f"cuCheckpointProcessCheckpoint for pid {lost} failed: {UNKNOWN}; and the workload "
            f"could not be resumed: pid {lost} is in the driver's FAILED state") in result.stderr
    assert "keep running" not in result.stderr
    assert gpus.state(lost) == ProcessState.FAILED
    assert_running(gpus, name, init, {token: init})
    # a process the driver already holds FAILED is refused before anything is locked
    before = len(gpus.fake.calls())
    result = checkpoint(gpus, name)
    assert result.returncode != 0
    assert (f"this container's GPU state cannot be checkpointed: pid {lost} is in the driver's "
            "FAILED state") in result.stderr
    assert not gpu_calls(gpus, before)
    assert_running(gpus, name, init, {token: init})
    gpus.remove(name)


def torpor_runc_pid(name: str) -> int:
    """The torpor-runc checkpointing `name` (a Python process; not its guardian or driver
    worker, which are its forks)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        if b"python" in args[0] and b"checkpoint" in args and name.encode() in args:
            found[int(entry)] = int(next(line.split()[1] for line in status.splitlines()
                                         if line.startswith("PPid:")))
    mains = [pid for pid, parent in found.items() if parent not in found]
    assert len(mains) == 1, found
    return mains[0]


def test_torpor_runc_killed_while_a_lock_takes_effect(gpus: GpuNode,
                                                      container_name: str) -> None:
    """The guardian hears of a pid before its lock call, and waits for the driver call in
    flight (until torpor's deadline): a lock that locked while torpor-runc was killed is
    unlocked."""
    name, token = container_name, "killlock"
    second = f"{token}-1"
    init = gpus.run(name, token, children=1)
    gpus.fake.inject(second, "lock=hang+")  # it locks, then the call never returns
    ctr = subprocess.Popen(
        ["ctr", "--address", gpus.node.address, "--namespace", gpus.node.namespace,
         "containers", "checkpoint", "--task", name, f"localhost/torpor-test/ck/{name}:1"],
        env=gpus.node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with reaped(ctr):
            wait_for(lambda: any(c.fields.get("note") == "hangs-after-taking-effect"
                                 for c in gpus.fake.calls("lock", token=second)),
                     timeout=30, what="the second lock to take effect")
            kill_pid(torpor_runc_pid(name))
            ctr.communicate(timeout=60)
    finally:
        gpus.fake.clear(second)
    assert ctr.returncode != 0
    pids = {t: pid_of(t) for t in (token, second)}
    wait_for(lambda: all(gpus.state(pid) == ProcessState.RUNNING for pid in pids.values()),
             timeout=20, what="the guardian to unlock both")
    assert_running(gpus, name, init, pids)
    gpus.remove(name)


def test_an_unexpected_answer_is_no_cpu_only_checkpoint(gpus: GpuNode,
                                                        container_name: str) -> None:
    """Only INVALID_VALUE and NOT_INITIALIZED mean "not a CUDA process"; a driver that answers
    CUDA_ERROR_OPERATING_SYSTEM (cuda-checkpoint issues 6, 37) gets the checkpoint refused
    with its words, instead of a checkpoint without the GPU state."""
    name, token = container_name, "oscall"
    init = gpus.run(name, token)
    gpus.fake.configure(gpus.gpus, restore_tid_error=304)
    before = len(gpus.fake.calls())
    result = checkpoint(gpus, name)
    gpus.fake.configure(gpus.gpus)
    assert result.returncode != 0
    assert (f"the CUDA driver cannot tell whether pid {init} is a CUDA process: "
            f"cuCheckpointProcessGetRestoreThreadId for pid {init} failed: "
            "CUDA_ERROR_OPERATING_SYSTEM (304): OS call failed or operation not supported on "
            "this OS") in result.stderr
    assert not gpu_calls(gpus, before)
    assert_running(gpus, name, init, {token: init})
    gpus.remove(name)


def test_a_two_gpu_process_is_restored_onto_other_gpus(gpus: GpuNode,
                                                       container_name: str) -> None:
    """Processes on two GPUs (given as /dev/nvidia0 and /dev/nvidia1), restored onto two other
    GPUs of the model: pairs for both, the driver remaps both, every process runs on."""
    name, token = container_name, "twogpu"
    tokens = [token, f"{token}-1"]
    init = gpus.run(name, token, children=1, sees=[0, 1], memory=[2 * GIB, 3 * GIB],
                    devices=(0, 1))
    assert all(Path(f"/proc/{init}/root/dev/nvidia{m}").is_char_device() for m in (0, 1))
    ref = f"localhost/torpor-test/checkpoint/{name}:1"
    gpus.ctr("containers", "checkpoint", "--task", name, ref)
    old = [str(g["uuid"]) for g in gpus.gpus]
    gpus.remove(name)
    others = [gpu(H200, 0), gpu(H200, 1)]
    gpus.fake.configure(others)
    before = len(gpus.fake.calls())
    gpus.ctr("containers", "restore", "--live", name, ref)
    restored = gpus.task_pid(name)
    restores = [c for c in gpu_calls(gpus, before, *tokens) if c.op == "restore"]
    assert len(restores) == 2 and all(c.result == 0 for c in restores)
    assert {c.fields["pairs"] for c in restores} == {
        f"{old[0]}>{others[0]['uuid']},{old[1]}>{others[1]['uuid']}"}
    for t in tokens:
        assert f"gpus={others[0]['uuid']},{others[1]['uuid']}" in (
            gpus.fake.dir / f"{t}.state").read_text()
        assert gpus.progressing(restored, t)
    gpus.remove(name)


def test_a_gpu_seen_without_memory_must_be_there_on_restore(gpus: GpuNode,
                                                            container_name: str) -> None:
    """A process holds memory on GPU 0 and only sees GPU 1 (NVML lists it on GPU 0 only).
    The driver checkpoints both, and pairs "must contain every checkpointed GPU": a node with
    one GPU is refused before CRIU runs, naming both GPUs."""
    name, token = container_name, "seenonly"
    gpus.run(name, token, sees=[0, 1], memory=[GIB, 0])
    ref = f"localhost/torpor-test/checkpoint/{name}:1"
    gpus.ctr("containers", "checkpoint", "--task", name, ref)
    gpus.remove(name)
    gpus.fake.configure([gpu(H200, 0)])
    before = len(gpus.fake.calls())
    result = gpus.ctr("containers", "restore", "--live", name, ref, check=False)
    assert result.returncode != 0
    assert ("the checkpoint's processes could see 2 GPU(s) (NVIDIA H200 (Hopper, compute "
            "capability 9.0), NVIDIA H200 (Hopper, compute capability 9.0)) and each must be "
            "restored onto one; this node has 1") in result.stderr, result.stderr
    assert not gpu_calls(gpus, before)
    assert not gpus.runc_knows(name)
    gpus.remove(name)


def test_driver_570_refuses_a_container_given_some_gpus_before_any_lock(
        gpus: GpuNode, container_name: str) -> None:
    """Drivers 570 to 575.57.07 fail with "operation not permitted" on a container given only
    some of the node's GPUs (cuda-checkpoint issues 12, 18, 24): refused before any lock."""
    name, token = container_name, "partial570"
    gpus.fake.configure(gpus.gpus, DRIVER_570)
    init = gpus.run(name, token, devices=(0,))
    before = len(gpus.fake.calls())
    result = checkpoint(gpus, name)
    assert result.returncode != 0
    assert ("this container is given 1 of this node's 2 GPUs (the container's /dev), and NVIDIA "
            "driver 570.86.10 cannot checkpoint a container given only some GPUs") in result.stderr
    assert not gpu_calls(gpus, before)
    assert_running(gpus, name, init, {token: init})
    gpus.remove(name)


@pytest.mark.parametrize("what", ["mig", "mps", "uvm"])
def test_what_the_driver_cannot_checkpoint_is_refused_before_any_lock(
        gpus: GpuNode, container_name: str, what: str) -> None:
    """MIG, MPS and UVM managed memory are not supported (CRIU's cuda plugin README); the
    driver does not keep a process in a good state after meeting UVM (cuda-checkpoint
    README). Refused before the first lock: the workload is never touched."""
    name, token = container_name, f"unsupported-{what}"
    if what == "mig":
        gpus.fake.configure([gpus.gpus[0], dict(gpus.gpus[1], mig=1)])
    init = gpus.run(name, token, *(["--managed", "/dev"] if what == "uvm" else []),
                    gpu_index=1, mps=what == "mps")
    before = len(gpus.fake.calls())
    result = checkpoint(gpus, name)
    assert result.returncode != 0
    assert "this container's GPU state cannot be checkpointed: " in result.stderr
    assert {"mig": f"GPU 1 ({gpus.gpus[1]['uuid']}) has MIG enabled",
            "mps": f"pids {init} are clients of an MPS server",
            "uvm": "UVM managed memory (cudaMallocManaged), which CUDA checkpoints do not "
                   f"support, in pid {init} (64 MiB mapped from /dev/nvidia-uvm)"}[what] \
        in result.stderr, result.stderr
    assert not gpu_calls(gpus, before)
    assert_running(gpus, name, init, {token: init})
    gpus.remove(name)


@pytest.fixture(scope="module")
def two_process_checkpoint(gpu_node: GpuNode) -> tuple[str, str]:
    """A checkpoint of two CUDA processes, for the restores below: (its ref, the token)."""
    name, token = "gpu-restore-matrix", "matrix"
    gpu_node.fake.configure(gpu_node.gpus)
    gpu_node.run(name, token, children=1)
    ref = f"localhost/torpor-test/checkpoint/{name}:1"
    gpu_node.ctr("containers", "checkpoint", "--task", name, ref)
    gpu_node.remove(name)
    return ref, token


RESTORE_FAILURES = {"restore-tid-fails": "restore_tid=999*1", "state-fails": "state=999*1",
                    "restore-fails": "restore=999*1", "unlock-fails": "unlock=999*1",
                    "restore-fails-but-restores": "restore=999+*1", "state-hangs": "state=hang*1",
                    "restore-hangs": "restore=hang*1", "unlock-hangs": "unlock=hang*1"}


@pytest.mark.parametrize("rule", RESTORE_FAILURES.values(), ids=RESTORE_FAILURES.keys())
def test_a_failed_gpu_restore_leaves_nothing(gpus: GpuNode, container_name: str,
                                             two_process_checkpoint: tuple[str, str],
                                             rule: str) -> None:
    """A failure or a hang at any driver step of a restore (of the second process): the
    restored container is killed and deleted; ctr says why, within torpor's deadline."""
    ref, token = two_process_checkpoint
    name, second = container_name, f"{token}-1"
    gpus.fake.inject(second, rule)
    started = time.monotonic()
    result = gpus.ctr("containers", "restore", "--live", name, ref, check=False)
    took = time.monotonic() - started
    gpus.fake.clear(second)
    assert result.returncode != 0
    op = {"restore_tid": "cuCheckpointProcessGetRestoreThreadId",
          "state": "cuCheckpointProcessGetState", "restore": "cuCheckpointProcessRestore",
          "unlock": "cuCheckpointProcessUnlock"}[rule.split("=")[0]]
    assert op in result.stderr, result.stderr
    assert took < 40
    assert not gpus.runc_knows(name), "a restore whose GPU half failed leaves no container"
    wait_for(lambda: not pids_of(token) and not pids_of(second), timeout=10,
             what="no restored process to be left")
    gpus.remove(name)
