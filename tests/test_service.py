"""torpord (docs/service.md) against a real containerd, runc and CRIU: the CLI hands its commands
to the service when it answers and runs them itself when it does not (or TORPOR_NO_SERVICE=1),
with the same results; the metrics count what the service ran; a peer other than root is
refused; a SIGKILL of the service in the middle of a checkpoint leaves nothing frozen."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from torpor import handoff

from .conftest import Nodes, run_torpor
from .support.containerd import Node
from .support.processes import free_port, kill_pid, parent_of, reaped, wait_for
from .support.registry import Registry
from .support.torpord import Torpord
from .support.workload import (
    COUNTER,
    containers,
    freezer_state,
    read_counter,
    task_pid,
    task_status,
    wait_counter_above,
)

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]
NO_SERVICE = {"TORPOR_NO_SERVICE": "1"}


def delta(before: dict[tuple[str, frozenset[tuple[str, str]]], float],
          after: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    """How much the samples of `name` with these labels (and any others) grew."""
    def total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> float:
        return sum(v for (n, ls), v in samples.items()
                   if n == name and set(labels.items()) <= ls)
    return total(after) - total(before)


@pytest.fixture(scope="module")
def service_node(nodes: Nodes, session_dir: Path) -> Node:
    base = session_dir / "service"
    base.mkdir()
    port = free_port()
    config = base / "node.toml"
    config.write_text(f'[runtime]\nstate_dir = "{base}/state"\nlog_dir = "{base}/state-logs"\n'
                      f'[image]\nstore = "{base}/store"\n'
                      f'[service]\nsocket = "{base}/torpord.sock"\n'
                      f'metrics = "127.0.0.1:{port}"\n')
    node = nodes.start("service", config=config)
    node.extra_env["TORPOR_TEST_METRICS_PORT"] = str(port)
    return node


@pytest.fixture(scope="module")
def registry(session_dir: Path) -> Iterator[Registry]:
    started = Registry(session_dir / "registries", f"svc-{uuid.uuid4().hex[:6]}").start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def torpord(service_node: Node, session_dir: Path) -> Iterator[Torpord]:
    base = session_dir / "service"
    service = Torpord(service_node, base / "torpord.sock",
                      int(service_node.extra_env["TORPOR_TEST_METRICS_PORT"]),
                      base / "torpord.log").start()
    yield service
    service.stop()


torpor = run_torpor   # (tests/conftest.py)


def test_the_socket_is_roots_alone(torpord: Torpord) -> None:
    assert (torpord.socket.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize("through", ["service", "in-process"])
def test_checkpoint_and_restore_with_and_without_the_service(
        service_node: Node, torpord: Torpord, test_image: dict[str, object], tmp_path: Path,
        through: str) -> None:
    node = service_node
    env = NO_SERVICE if through == "in-process" else {}
    name = f"svc-{through}"
    before = {c: torpord.count(c) for c in ("checkpoint", "restore")}
    with containers(node) as names:
        names += [name, f"{name}-b"]
        node.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c", COUNTER)
        counted = wait_counter_above(node, name, 10)
        result = torpor(node, "checkpoint", name, "-o", str(tmp_path / "ck"), "--json", env=env)
        assert json.loads(result.stdout)["sizes"]["memory_pages"] > 0  # stdout came back whole
        assert task_status(node, name) == "STOPPED"
        torpor(node, "restore", str(tmp_path / "ck"), "--name", f"{name}-b", env=env)
        resumed = read_counter(node, f"{name}-b")
        assert resumed >= counted
        wait_counter_above(node, f"{name}-b", resumed + 5)
    ran = 1 if through == "service" else 0
    assert {c: torpord.count(c) for c in before} == {c: n + ran for c, n in before.items()}, \
        torpord.metrics_text()


def test_the_metrics_count_the_bytes_each_command_moved(
        service_node: Node, torpord: Torpord, registry: Registry, test_image: dict[str, object],
        ) -> None:
    """A checkpoint pushed to a registry, then restored from it twice through the service:
    the first restore downloads it (the node's store no longer holds it), the second takes
    it from the store; /metrics grew by exactly what the commands' --json said they moved."""
    node = service_node
    name = "svc-bytes"
    ref = f"{registry.host}/svc/bytes:1"
    before = torpord.samples()
    with containers(node) as names:
        names += [name, f"{name}-b", f"{name}-c"]
        node.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c", COUNTER)
        wait_counter_above(node, name, 5)
        made = json.loads(torpor(node, "checkpoint", name, "-t", ref, "--push",
                                 "--leave-running", "--json").stdout)
        torpor(node, "rm", ref)
        fetched = json.loads(torpor(node, "restore", ref, "--name", f"{name}-b",
                                    "--json").stdout)
        stored = json.loads(torpor(node, "restore", ref, "--name", f"{name}-c",
                                   "--json").stdout)
        wait_counter_above(node, f"{name}-c", read_counter(node, f"{name}-c") + 3)
    after = torpord.samples()
    moved = {(command, kind): delta(before, after, "torpor_command_bytes_total",
                                    command=command, kind=kind)
             for command in ("checkpoint", "restore")
             for kind in ("written", "pushed", "downloaded", "local")}
    assert moved == {
        ("checkpoint", "written"): made["written_bytes"],
        ("checkpoint", "pushed"): made["pushed"]["bytes_uploaded"],
        ("checkpoint", "downloaded"): 0, ("checkpoint", "local"): 0,
        ("restore", "written"): 0, ("restore", "pushed"): 0,
        ("restore", "downloaded"): fetched["downloaded_bytes"] + stored["downloaded_bytes"],
        ("restore", "local"): fetched["local_bytes"] + stored["local_bytes"],
    }, torpord.metrics_text()
    assert made["written_bytes"] == made["compressed_bytes"] > 0   # a first generation
    assert made["pushed"]["bytes_uploaded"] >= made["compressed_bytes"]
    # the first restore downloaded the image, the second found it all in the store
    assert fetched["downloaded_bytes"] >= made["compressed_bytes"] and fetched["local_bytes"] == 0
    assert stored["local_bytes"] >= made["compressed_bytes"]
    assert stored["downloaded_bytes"] < made["compressed_bytes"] // 10   # configs only


def test_a_failing_command_reads_the_same_either_way(service_node: Node, torpord: Torpord,
                                                     tmp_path: Path) -> None:
    failures = torpord.count("restore", "failure")
    before = torpord.samples()
    missing = ["restore", str(tmp_path / "no-such-checkpoint"), "--name", "svc-missing"]
    served = torpor(service_node, *missing, check=False)
    local = torpor(service_node, *missing, env=NO_SERVICE, check=False)
    assert served.returncode != 0
    assert (served.returncode, served.stdout, served.stderr) == \
        (local.returncode, local.stdout, local.stderr)
    assert torpord.count("restore", "failure") == failures + 1
    grown = {dict(labels)["error"] for (name, labels), value in torpord.samples().items()
             if name == "torpor_command_failures_total" and dict(labels)["command"] == "restore"
             and value > before.get((name, labels), 0.0)}
    assert grown == {"ImageError"}, torpord.metrics_text()   # what the child raised


def connect_as_nobody(path: Path) -> str:
    """What a process of uid 65534 gets from connecting to `path`: the service's first line,
    or the error that stopped it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        try:
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(str(path))
                answer = sock.recv(65536).decode()
        except OSError as e:
            answer = f"{type(e).__name__}: {e}"
        os.write(write_end, answer.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        answer = f.read().decode()
    os.waitpid(pid, 0)
    return answer


def test_a_peer_other_than_root_is_refused(torpord: Torpord) -> None:
    assert connect_as_nobody(torpord.socket).startswith("PermissionError")  # the mode first
    os.chmod(torpord.socket, 0o666)  # then the credentials, where the mode would let it in
    try:
        answer = handoff.decode(connect_as_nobody(torpord.socket).strip().encode())
    finally:
        os.chmod(torpord.socket, 0o600)
    assert "uid 65534" in answer["refused"] and "root only" in answer["refused"]


def scheduled_rounds(node: Node, name: str) -> int:
    for entry in json.loads(torpor(node, "schedule", "ls", "--json").stdout):
        if entry["container"] == name:
            return int(entry["rounds"])
    raise AssertionError(f"no schedule for {name}")


def test_schedules_of_two_containers_survive_a_restart_of_the_service(
        service_node: Node, torpord: Torpord, test_image: dict[str, object]) -> None:
    """Two containers checkpointed every 2 s by the service, one round each at a time, each
    keeping its 2 newest generations; torpord killed with SIGKILL and started again: the
    rounds go on from the book in the image store, and the containers never stop."""
    node = service_node
    pair = ["svc-sched-a", "svc-sched-b"]
    with containers(node) as names:
        for name in pair:
            names.append(name)
            node.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c", COUNTER)
        for name in pair:
            wait_counter_above(node, name, 2)
            torpor(node, "schedule", "add", name, "-t", f"localhost/sched/{name}:s",
                   "--every", "2s", "--keep", "2")
        try:
            wait_for(lambda: all(scheduled_rounds(node, n) >= 1 for n in pair), timeout=120,
                     interval=0.5, what="a first round of each schedule")
            kill_pid(torpord.pid)
            assert torpord.proc is not None
            torpord.proc.wait(10)
            done = {n: scheduled_rounds(node, n) for n in pair}
            torpord.start()
            wait_for(lambda: all(scheduled_rounds(node, n) >= done[n] + 2 for n in pair),
                     timeout=180, interval=0.5, what="two more rounds of each, after the restart")
            listed = json.loads(torpor(node, "schedule", "ls", "--json").stdout)
            assert all(e["last_status"] == 0 for e in listed if e["container"] in pair), listed
        finally:
            for name in pair:
                torpor(node, "schedule", "rm", name, check=False)
        refs = [e["ref"] for e in json.loads(torpor(node, "ls", "--json").stdout)]
        for name in pair:
            stamped = [r for r in refs if r.startswith(f"localhost/sched/{name}:s-")]
            assert len(stamped) == 2, refs          # retention: the 2 newest
            assert f"localhost/sched/{name}:s" in refs   # and the moving tag
            assert task_status(node, name) == "RUNNING"
        assert torpord.count("checkpoint") >= 4, torpord.metrics_text()


def test_schedule_add_says_when_the_service_is_not_running(service_node: Node,
                                                           tmp_path: Path) -> None:
    config = tmp_path / "no-service.toml"
    config.write_text(service_node.torpor_config.read_text().replace(
        "torpord.sock", "nobody-listens.sock"))
    said = torpor(service_node, "schedule", "add", "any", "-t", "localhost/x:y", "--every",
                  "1m", env={"TORPOR_CONFIG": str(config)}, check=False)
    assert said.returncode != 0
    assert "torpord does not answer" in said.stderr and "systemctl" in said.stderr, said.stderr


def test_a_killed_service_leaves_the_checkpoint_done_and_nothing_frozen(
        service_node: Node, torpord: Torpord, test_image: dict[str, object],
        tmp_path: Path) -> None:
    """SIGKILL of torpord while a checkpoint's child runs: the child is no child of the
    service's life, it finishes and reports to the CLI itself; the container ends checkpointed
    (stopped, its checkpoint whole) or running, never frozen. Runs last: it restarts torpord."""
    node = service_node
    name = "svc-killed"
    with containers(node) as names, reaped() as started:
        names += [name]
        node.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c", COUNTER)
        wait_counter_above(node, name, 5)
        pid = task_pid(node, name)
        cli = subprocess.Popen([str(node.bin_dir / "torpor"), "checkpoint", name, "-o",
                                str(tmp_path / "ck")], env=node.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        started.append(cli)
        wait_for(torpord.children, timeout=30, interval=0.01, what="the checkpoint's child")
        time.sleep(0.3)  # into the checkpoint: the container's record, the dump
        kill_pid(torpord.pid)
        assert torpord.proc is not None
        torpord.proc.wait(10)
        out, err = cli.communicate(timeout=300)
        status = task_status(node, name)
        if cli.returncode == 0:
            assert status == "STOPPED", (status, err)
            assert (tmp_path / "ck" / "checkpoint.json").is_file()
        else:
            assert status == "RUNNING", (status, out, err)
        if status == "RUNNING":
            assert freezer_state(pid) != "FROZEN"
    torpord.start()  # a stale socket file is no obstacle
    assert torpor(node, "ls").returncode == 0


def test_a_killed_service_leaves_a_restore_whole_or_nothing(
        service_node: Node, torpord: Torpord, test_image: dict[str, object],
        tmp_path: Path) -> None:
    """SIGKILL of torpord while a restore's child runs: the child finishes alone and reports
    to the CLI; the restored container runs on from the checkpoint's count, or the restore
    failed and left no container or task behind."""
    node = service_node
    name, restored = "svc-killed-r", "svc-killed-r2"
    with containers(node) as names, reaped() as started:
        names += [name, restored]
        node.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c", COUNTER)
        before = wait_counter_above(node, name, 5)
        torpor(node, "checkpoint", name, "-o", str(tmp_path / "ck"))   # it stops the container
        node.ctr("containers", "rm", name)
        cli = subprocess.Popen([str(node.bin_dir / "torpor"), "restore", str(tmp_path / "ck"),
                                "--name", restored], env=node.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        started.append(cli)
        wait_for(torpord.children, timeout=30, interval=0.01, what="the restore's child")
        time.sleep(0.3)  # into the restore: the image unpacked, the task being made
        kill_pid(torpord.pid)
        assert torpord.proc is not None
        torpord.proc.wait(10)
        out, err = cli.communicate(timeout=300)
        listed = node.ctr("containers", "ls", "-q").stdout.split()
        if cli.returncode == 0:
            assert task_status(node, restored) == "RUNNING", (out, err)
            assert read_counter(node, restored) >= before   # from the checkpoint, not zero
        else:
            assert restored not in listed, (out, err)
    torpord.start()
    assert torpor(node, "ls").returncode == 0


@pytest.mark.parametrize("service", ["running", "stopped"])
def test_torpor_runc_checkpoints_through_the_service_when_it_runs(
        service_node: Node, torpord: Torpord, test_image: dict[str, object], tmp_path: Path,
        service: str) -> None:
    """containerd's shim runs torpor-runc checkpoint; with torpord answering, torpor-runc hands
    the checkpoint to it (the metrics count "torpor-runc checkpoint"), without it, it runs the
    checkpoint itself; either way the container restores and its counter goes on."""
    node = service_node
    name = f"svc-runc-{service}"
    if service == "stopped":
        torpord.stop()
    try:
        before = torpord.count("torpor-runc checkpoint") if service == "running" else 0.0
        with containers(node) as names:
            names += [name, f"{name}-b"]
            node.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c", COUNTER)
            counted = wait_counter_above(node, name, 5)
            torpor(node, "checkpoint", name, "-o", str(tmp_path / "ck"))
            assert task_status(node, name) == "STOPPED"
            torpor(node, "restore", str(tmp_path / "ck"), "--name", f"{name}-b")
            resumed = read_counter(node, f"{name}-b")
            assert resumed >= counted
            wait_counter_above(node, f"{name}-b", resumed + 3)
        if service == "running":
            assert torpord.count("torpor-runc checkpoint") == before + 1, torpord.metrics_text()
        else:
            assert not torpord.socket.exists()   # it ran with no service at all
    finally:
        if service == "stopped":
            torpord.start()


def test_torpor_runc_restores_through_the_service_below_the_shim(
        service_node: Node, torpord: Torpord, test_image: dict[str, object],
        tmp_path: Path) -> None:
    """torpor-runc's restore hands its work to torpord, and runs `runc restore` itself when
    torpord's child asks: the restored init is the shim's child, so the shim sees it exit
    (the task stops), and the restored counter went on from the checkpoint's count."""
    node = service_node
    name, restored = "svc-restore", "svc-restore-b"
    before = torpord.count("torpor-runc restore")
    with containers(node) as names:
        names += [name, restored]
        node.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c", COUNTER)
        counted = wait_counter_above(node, name, 5)
        torpor(node, "checkpoint", name, "-o", str(tmp_path / "ck"))
        torpor(node, "restore", str(tmp_path / "ck"), "--name", restored)
        wait_counter_above(node, restored, counted + 3)
        init = task_pid(node, restored)
        parent = parent_of(init)
        assert Path(f"/proc/{parent}/comm").read_text().strip() == "containerd-shim"
        os.kill(init, signal.SIGKILL)   # the restored container's own init: its end is seen
        wait_for(lambda: task_status(node, restored) == "STOPPED", timeout=30,
                 what="the shim to see the restored init exit")
    assert torpord.count("torpor-runc restore") == before + 1, torpord.metrics_text()


def test_torpor_runc_reports_the_same_through_the_service(service_node: Node, torpord: Torpord,
                                                          tmp_path: Path) -> None:
    """What runc answers itself (no such container: torpor-runc execs runc): the same exit
    status, output and --log JSON lines through torpord as in-process."""
    seen = []
    for env in ({}, NO_SERVICE):
        log = tmp_path / f"log-{len(seen)}.json"
        done = subprocess.run([str(service_node.bin_dir / "torpor-runc"), "--root",
                               str(tmp_path / "runc-root"), "--log", str(log), "--log-format",
                               "json", "checkpoint", "--image-path", str(tmp_path / "img"),
                               "svc-no-such"], env={**service_node.env, **env},
                              capture_output=True, text=True, timeout=60)
        lines = [{k: v for k, v in json.loads(line).items() if k != "time"}
                 for line in log.read_text().splitlines()] if log.exists() else []
        seen.append((done.returncode, done.stdout, done.stderr, lines))
    assert seen[0] == seen[1]
    assert seen[0][0] == 1 and seen[0][3] == [{"level": "error", "msg": "container does not exist"}]
    failed = [labels for (name, labels), value in torpord.samples().items()
              if name == "torpor_command_failures_total" and value > 0]
    assert frozenset({"command": "torpor-runc checkpoint", "error": "ExitStatus"}.items()) \
        in failed, torpord.metrics_text()
