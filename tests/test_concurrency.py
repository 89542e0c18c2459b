"""Checkpoints at the same time: of eight containers, of one container twice, of two containers
with the same namespace and name under two containerd instances. Every checkpoint has its own
journal, request and scratch space, so none sees another's; a second checkpoint of one
container is refused, naming the first."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from .conftest import IMAGE, run_torpor
from .support.containerd import Node
from .support.processes import reaped, wait_for
from .support.workload import (
    COUNTER,
    containers,
    read_counter,
    read_file,
    task_status,
    wait_counter_above,
)
from .support.world import World

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]
LOST: list[str] = []


def start_torpor(node: Node, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(node.bin_dir / "torpor"), *args], env=node.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def leftovers(node: Node, state_dir: Path) -> list[str]:
    found = [str(p) for p in (state_dir / "checkpoints").glob("*") if p.name != "locks"]
    found += [str(p) for p in (state_dir / "checkpoints" / "locks").glob("*")]
    found += [str(p) for p in (state_dir.parent / "store" / "journals").glob("*")]  # the world's
    return found + [f"lease {x}" for x in node.ctr("leases", "ls", "-q").stdout.split()]


@pytest.mark.parametrize("leave_running", [False, True], ids=["stop", "leave-running"])
def test_eight_containers_at_once(node: Node, state_dir: Path, tmp_path: Path,
                                  leave_running: bool) -> None:
    tag = "lr" if leave_running else "stop"
    with containers(node) as names, reaped() as started:
        counted = {}
        for i in range(8):
            name = f"eight-{tag}-{i}"
            names.append(name)
            node.ctr("run", "-d", *SHIM, IMAGE, name, "sh", "-c", COUNTER)
        for name in list(names):
            counted[name] = wait_counter_above(node, name, 3, timeout=30)
        flags = ["--leave-running"] if leave_running else []
        running = {name: start_torpor(node, "checkpoint", name, "-o", str(tmp_path / name), *flags)
                   for name in counted}
        started += running.values()
        results = {name: cli.communicate(timeout=300) for name, cli in running.items()}
        failed = {name: err for name, (_, err) in results.items() if running[name].returncode}
        LOST.extend(name for name in failed if task_status(node, name) != "RUNNING")
        assert failed == {}, "\n".join(f"{n}: {e}" for n, e in failed.items())
        for name in counted:
            assert (tmp_path / name / "checkpoint.json").exists()
            assert task_status(node, name) == ("RUNNING" if leave_running else "STOPPED")
        if leave_running:
            for name, before in counted.items():
                wait_counter_above(node, name, before, timeout=30)
        else:  # two of them back, counting on from where they were
            for name in (names[0], names[-1]):
                names.append(f"{name}-b")
                run_torpor(node, "restore", str(tmp_path / name), "--name", f"{name}-b")
                assert read_counter(node, f"{name}-b") >= counted[name]
        assert leftovers(node, state_dir) == []


def test_a_second_checkpoint_of_one_container_is_refused(node: Node, state_dir: Path,
                                                         tmp_path: Path) -> None:
    hold = state_dir / "test-hold" / "dumping"
    hold.parent.mkdir(parents=True, exist_ok=True)
    with containers(node) as names, reaped() as started:
        names += ["twice", "twice-b"]
        node.ctr("run", "-d", *SHIM, IMAGE, "twice", "sh", "-c", COUNTER)
        before = wait_counter_above(node, "twice", 3)
        hold.touch()
        try:
            first = start_torpor(node, "checkpoint", "twice", "-o", str(tmp_path / "first"))
            started.append(first)
            wait_for(Path(f"{hold}.pid").exists, timeout=60, what="the first checkpoint")
            second = run_torpor(node, "checkpoint", "twice", "-o", str(tmp_path / "second"),
                                check=False)
        finally:
            hold.unlink(missing_ok=True)
            Path(f"{hold}.pid").unlink(missing_ok=True)
        assert second.returncode != 0
        assert "container twice is already being checkpointed (by torpor pid " \
            f"{first.pid})" in second.stderr, second.stderr
        assert not (tmp_path / "second").exists()
        _, err = first.communicate(timeout=120)
        assert first.returncode == 0, err
        run_torpor(node, "restore", str(tmp_path / "first"), "--name", "twice-b")
        assert read_counter(node, "twice-b") >= before
        assert leftovers(node, state_dir) == []


def test_two_containerds_with_the_same_names_keep_apart(world: World, node: Node,
                                                        state_dir: Path, tmp_path: Path) -> None:
    """Same namespace, same container name, one host: checkpoints and restores at the same
    time, each with its own state."""
    twin = Node(world.base / "nodes", "twin", world.bin, world.config)
    twin.namespace = node.namespace
    world.nodes.append(twin)  # stopped with the world, by pid
    twin.start()
    twin.ctr("images", "import", str(world.image_tar))
    pair = {"a": node, "twin": twin}
    with containers(node) as on_a, containers(twin) as on_twin, reaped() as started:
        on_a += ["same", "same-b"]
        on_twin += ["same", "same-b"]
        for label, n in pair.items():
            # runc's state and the cgroup must differ too (they would collide without torpor)
            runtime = ["--runtime", "io.containerd.runc.v2", "--runc-binary",
                       str(world.bin / "torpor-runc"), "--runc-root", str(twin.root / "runc"),
                       "--cgroup", f"/torpor-twin-{os.getpid()}/same"] if n is twin else SHIM
            n.ctr("run", "-d", *runtime, IMAGE, "same", "sh", "-c",
                  f"echo {label} > /root/who; {COUNTER}")
            wait_counter_above(n, "same", 3)
        clis = {label: start_torpor(n, "checkpoint", "same", "-o", str(tmp_path / label))
                for label, n in pair.items()}
        started += clis.values()
        for cli in clis.values():
            _, err = cli.communicate(timeout=120)
            assert cli.returncode == 0, err
        # the checkpoint names no runc root a restore would use: the twin's user says it, as
        # with ctr --runc-root
        own_root = {"a": [], "twin": ["--runc-root", str(twin.root / "runc")]}
        restores = {label: start_torpor(n, "restore", str(tmp_path / label), "--name", "same-b",
                                        *own_root[label])
                    for label, n in pair.items()}
        started += restores.values()
        for cli in restores.values():
            _, err = cli.communicate(timeout=120)
            assert cli.returncode == 0, err
        for label, n in pair.items():
            assert read_file(n, "same-b", "/root/who").strip() == label
            wait_counter_above(n, "same-b", read_counter(n, "same-b"))
    for controller in Path("/sys/fs/cgroup").iterdir():  # the twin's cgroup parent
        with contextlib.suppress(OSError):
            (controller / f"torpor-twin-{os.getpid()}").rmdir()
    assert leftovers(node, state_dir) == [] and leftovers(twin, state_dir) == []


def test_no_workload_was_lost() -> None:
    assert LOST == []
