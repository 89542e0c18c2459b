"""Every restore and checkpoint step has a deadline: a CRIU that hangs is killed, with runc and
what CRIU started, the half-restored container removed, the lock released, and the error names
the step and CRIU's last log lines. Nothing is left behind.

The hang is real: CRIU, started by runc in swrk mode under real containerd, runs an action
script that sleeps (in wait4, as a CRIU whose restorer failed does). The node's operator gives
CRIU that script through CRIU_CONFIG_FILE in containerd's environment, which reaches torpor-runc,
runc and CRIU; the script sleeps only at the action the test names in a marker file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Nodes, run_torpor
from .support.containerd import Node
from .support.processes import parent_of, stat_fields, wait_for
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
TIMEOUT_S = 6      # [restore] and [checkpoint] timeout_s on this node
SLACK_S = 25       # what a loaded 2-core machine may add to the deadline

HANG = """#!/bin/sh
# CRIU's action script for tests/test_deadlines.py: sleep at the action named by a marker
[ -e "{dir}/hang-$CRTOOLS_SCRIPT_ACTION" ] || exit 0
cat /proc/$PPID/cgroup > "{dir}/cgroup-$CRTOOLS_SCRIPT_ACTION"
echo "$$ $PPID" > "{dir}/hung-$CRTOOLS_SCRIPT_ACTION.tmp"
mv "{dir}/hung-$CRTOOLS_SCRIPT_ACTION.tmp" "{dir}/hung-$CRTOOLS_SCRIPT_ACTION"
exec sleep 3600
"""


@pytest.fixture(scope="module")
def hangs(session_dir: Path) -> Path:
    directory = session_dir / "deadline-hangs"
    directory.mkdir(exist_ok=True)
    script = directory / "hang.sh"
    script.write_text(HANG.format(dir=directory))
    script.chmod(0o755)
    (directory / "criu.conf").write_text(f"action-script {script}\n")
    return directory


@pytest.fixture(scope="module")
def dnode(nodes: Nodes, session_dir: Path, hangs: Path, containerd_version: str,
          runc_version: str) -> Node:
    """A node whose CRIU runs the test's action script, with short deadlines, of the versions
    the session asks for (`pytest --containerd 2 --runc 1.3`)."""
    config = session_dir / "deadlines.toml"
    config.write_text(f'[runtime]\nstate_dir = "{session_dir}/deadlines-state"\n'
                      f'log_dir = "{session_dir}/deadlines-state-logs"\n'
                      f'[image]\nstore = "{session_dir}/deadlines-store"\n'
                      f'[checkpoint]\ntimeout_s = {TIMEOUT_S}\n'
                      f'[restore]\ntimeout_s = {TIMEOUT_S}\n'
                      f'[service]\nsocket = "{session_dir}/deadlines-torpord.sock"\n'
                      'metrics = ""\n')
    return nodes.start("deadlines", config=config,
                       extra_env={"CRIU_CONFIG_FILE": str(hangs / "criu.conf")},
                       containerd=containerd_version, runc=runc_version)


def state_dir(node: Node) -> Path:
    return node.root.parent.parent / "deadlines-state"


torpor = run_torpor   # (tests/conftest.py)


@contextlib.contextmanager
def hang_at(hangs: Path, action: str) -> Iterator[Path]:
    """CRIU sleeps at `action` while the block runs; yields where the script says who it is."""
    marker = hangs / f"hang-{action}"
    hung = hangs / f"hung-{action}"
    hung.unlink(missing_ok=True)
    marker.touch()
    try:
        yield hung
    finally:
        marker.unlink(missing_ok=True)
        if hung.exists():  # let a CRIU nobody killed go on (the sleep is the test's own)
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(hung.read_text().split()[0]), signal.SIGKILL)


def hung_processes(hung: Path) -> list[int]:
    """The sleeping script, the CRIU that runs it and the runc that runs CRIU, by pid."""
    wait_for(hung.exists, timeout=120, what=f"CRIU to reach {hung.name}")
    script, criu = (int(p) for p in hung.read_text().split())
    return [script, criu, parent_of(criu)]


def container_processes(cgroup_file: Path) -> list[int]:
    """What is left in the (freezer, or v2) cgroup CRIU was in: the restored container's."""
    for line in cgroup_file.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "freezer" in controllers.split(",") or controllers == "":
            base = "/sys/fs/cgroup/freezer" if controllers else "/sys/fs/cgroup"
            procs = Path(base + path) / "cgroup.procs"
            return [int(p) for p in procs.read_text().split()] if procs.exists() else []
    return []


def alive(pid: int) -> bool:
    try:
        return stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def counter(node: Node, names: list[str], name: str) -> int:
    names.append(name)
    node.ctr("run", "-d", *SHIM, "localhost/torpor-test/busybox:1", name, "sh", "-c", COUNTER)
    return wait_counter_above(node, name, 5)


def listed(node: Node, *what: str) -> list[str]:
    lines = node.ctr(*what).stdout.splitlines()[1:]
    return [line.split()[0] for line in lines if line.split()]


def restore_leftovers(node: Node, name: str) -> list[str]:
    """What a failed restore must not leave: container, task, snapshot, work and record dirs."""
    found = [f"container {n}" for n in listed(node, "containers", "ls") if n == name]
    found += [f"task {n}" for n in listed(node, "tasks", "ls") if n == name]
    found += [f"snapshot {n}" for n in listed(node, "snapshots", "ls") if n == name]
    state = state_dir(node)
    found += [str(p) for p in (state / "restore-work").glob("*")]
    found += [str(p) for p in (state / "containers").glob(f"*/{name}*")]
    found += [str(p) for p in (state / "pod-files").glob(f"*{name}*")]
    runc_state = Path("/run/containerd/runc") / node.namespace   # runc's root for the node
    found += [str(runc_state / name)] if (runc_state / name).exists() else []
    return found + mounts_under(state) + mounts_under(runc_state)


def mounts_under(root: Path) -> list[str]:
    """Mounts a killed CRIU would leave (its cgroup yard, in its work directory)."""
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        return [f"mount {p}" for p in (line.split()[4] for line in f) if p.startswith(prefix)]


def checkpoint_leftovers(node: Node) -> list[str]:
    """What a failed checkpoint must not leave: journals, locks, scratch space, leases."""
    root = state_dir(node) / "checkpoints"
    found = [str(p) for p in root.glob("*") if p.name != "locks"]
    found += [str(p) for p in (root / "locks").glob("*")]
    found += [str(p) for p in (node.root.parent.parent / "deadlines-store" / "scratch").glob("*")]
    found += [f"lease {lease}" for lease in node.ctr("leases", "ls", "-q").stdout.split()]
    return found + mounts_under(state_dir(node))


@pytest.mark.parametrize(("action", "service"), [
    ("setup-namespaces", "in-process"), ("post-restore", "in-process"),
    ("setup-namespaces", "torpord")])   # torpord's child asks torpor-runc to run runc
def test_a_restore_whose_criu_hangs_is_killed_and_leaves_nothing(
        dnode: Node, hangs: Path, tmp_path: Path, session_dir: Path, action: str,
        service: str) -> None:
    source, name = f"hr-src-{action}-{service}", f"hr-{action}-{service}"
    with contextlib.ExitStack() as stack, containers(dnode) as names:
        if service == "torpord":
            torpord = Torpord(dnode, session_dir / "deadlines-torpord.sock", 0,
                              tmp_path / "torpord.log").start()
            stack.callback(torpord.stop)
        counter(dnode, names, source)
        torpor(dnode, "checkpoint", source, "-o", str(tmp_path / "ck"), "--leave-running")
        names.append(name)
        with hang_at(hangs, action) as hung:
            started = time.monotonic()
            cli = subprocess.Popen([str(dnode.bin_dir / "torpor"), "restore", str(tmp_path / "ck"),
                                    "--name", name], env=dnode.env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                hung_pids = hung_processes(hung)
                if service == "torpord":   # the CLI's restore and torpor-runc's, both there
                    assert len(torpord.children()) == 2, torpord.children()
                out, err = cli.communicate(timeout=TIMEOUT_S + SLACK_S + 30)
            finally:
                if cli.poll() is None:
                    cli.kill()
                    cli.communicate()
            took = time.monotonic() - started
        # it returned within the deadline, saying which step and where CRIU stood
        assert cli.returncode != 0, out
        assert took < TIMEOUT_S + SLACK_S, (took, err)
        assert "runc restore (CRIU) did not finish within" in err, err
        assert f"Running {action} scripts" in err, err
        # the hung CRIU, its script and runc are gone, and so is everything of the restore:
        # no process of the half-restored container (runc put CRIU in its cgroup) either
        print(f"{action}: returned after {took:.1f}s (deadline {TIMEOUT_S}s)")
        assert [p for p in hung_pids if alive(p)] == [], hung_pids
        assert container_processes(hangs / f"cgroup-{action}") == []
        assert restore_leftovers(dnode, name) == []
        # the name is free again: the same restore, without the hang, succeeds
        restored_from = read_counter(dnode, source)
        torpor(dnode, "restore", str(tmp_path / "ck"), "--name", name)
        assert task_status(dnode, name) == "RUNNING"
        wait_counter_above(dnode, name, read_counter(dnode, name) + 3)
        assert read_counter(dnode, name) > 0 and restored_from > 0


def checkpoint_hung_at(node: Node, hangs: Path, action: str, name: str,
                       *args: str) -> tuple[subprocess.CompletedProcess[str], float, list[int]]:
    """`torpor checkpoint NAME ARGS` while CRIU sleeps at `action`: how it ended, how long it
    took, and the pids of what hung."""
    with hang_at(hangs, action) as hung:
        started = time.monotonic()
        cli = subprocess.Popen([str(node.bin_dir / "torpor"), "checkpoint", name, *args],
                               env=node.env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
        try:
            hung_pids = hung_processes(hung)
            out, err = cli.communicate(timeout=TIMEOUT_S + SLACK_S + 30)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.communicate()
        took = time.monotonic() - started
    return subprocess.CompletedProcess(cli.args, cli.returncode, out, err), took, hung_pids


@pytest.mark.parametrize("flags", [[], ["--leave-running"]], ids=["stopping", "leave-running"])
def test_a_checkpoint_whose_criu_hangs_before_the_dump_is_killed_and_the_workload_runs_on(
        dnode: Node, hangs: Path, tmp_path: Path, flags: list[str]) -> None:
    """CRIU sleeps at pre-dump, the container frozen (by torpor-runc, or by torpor's own
    pre-dump action with --leave-running): killed at the deadline, the container thawed."""
    name = f"hc-{'lr' if flags else 'stop'}"
    with containers(dnode) as names:
        before = counter(dnode, names, name)
        result, took, hung_pids = checkpoint_hung_at(dnode, hangs, "pre-dump", name, "-o",
                                                     str(tmp_path / "ck"), *flags)
        err = result.stderr
        assert result.returncode != 0, result.stdout
        assert took < TIMEOUT_S + SLACK_S, (took, err)
        assert "runc checkpoint (CRIU) did not finish within" in err, err
        assert "Running pre-dump scripts" in err, err
        assert f"{name} {'was never stopped' if flags else 'runs on, as before'}" in err, err
        print(f"checkpoint {flags}: returned after {took:.1f}s (deadline {TIMEOUT_S}s)")
        assert [p for p in hung_pids if alive(p)] == [], hung_pids
        # the workload was not lost: running, thawed, counting on from where it was
        assert task_status(dnode, name) == "RUNNING"
        assert freezer_state(task_pid(dnode, name)) == "THAWED"
        assert read_counter(dnode, name) >= before
        wait_counter_above(dnode, name, read_counter(dnode, name) + 3)
        assert not (tmp_path / "ck").exists()
        assert checkpoint_leftovers(dnode) == []
        # the container's lock is free: the next checkpoint proceeds, and restores
        torpor(dnode, "checkpoint", name, "-o", str(tmp_path / "ck2"), "--leave-running")
        assert (tmp_path / "ck2" / "checkpoint.json").exists()
        assert os.listdir(tmp_path / "ck2" / "criu")


def test_a_criu_that_hangs_after_the_commit_is_killed_and_the_checkpoint_stands(
        dnode: Node, hangs: Path, tmp_path: Path) -> None:
    """CRIU sleeps at post-dump after torpor's own post-dump action let it go (CRIU runs the
    scripts last configured first): the checkpoint is complete, so at the deadline CRIU is
    killed and the container stopped, as the commit asked, and the checkpoint restores."""
    name = "hc-committed"
    with containers(dnode) as names:
        before = counter(dnode, names, name)
        result, took, hung_pids = checkpoint_hung_at(dnode, hangs, "post-dump", name, "-o",
                                                     str(tmp_path / "ck"))
        assert result.returncode == 0, result.stderr
        print(f"after the commit: returned after {took:.1f}s (deadline {TIMEOUT_S}s)")
        assert took < TIMEOUT_S + SLACK_S, (took, result.stderr)
        assert [p for p in hung_pids if alive(p)] == [], hung_pids
        assert task_status(dnode, name) == "STOPPED"
        assert checkpoint_leftovers(dnode) == []
        names.append(f"{name}-b")
        torpor(dnode, "restore", str(tmp_path / "ck"), "--name", f"{name}-b")
        assert read_counter(dnode, f"{name}-b") >= before
        wait_counter_above(dnode, f"{name}-b", read_counter(dnode, f"{name}-b") + 3)


def test_a_torpor_runc_that_hangs_is_given_up_and_the_workload_runs_on(
        dnode: Node, tmp_path: Path) -> None:
    """torpor-runc itself holds (the test hold at `frozen`, the container frozen), past the
    deadline `torpor checkpoint` gives Tasks.Checkpoint: the checkpoint is called off, and
    when torpor-runc goes on it finds it so, thaws the container and ends."""
    from torpor.ops.checkpoint_dir import RUNTIME_SLACK_S
    from torpor.ops.transaction import OVERRAN_SETTLE_S

    name = "hc-runtime"
    marker = state_dir(dnode) / "test-hold" / "frozen"
    marker.parent.mkdir(parents=True, exist_ok=True)
    with containers(dnode) as names:
        before = counter(dnode, names, name)
        marker.touch()
        try:
            started = time.monotonic()
            result = torpor(dnode, "checkpoint", name, "-o", str(tmp_path / "ck"), check=False)
            took = time.monotonic() - started
        finally:
            marker.unlink(missing_ok=True)
        limit = TIMEOUT_S + RUNTIME_SLACK_S
        print(f"held torpor-runc: returned after {took:.1f}s (deadline {limit:.0f}s)")
        assert result.returncode != 0, result.stdout
        assert f"did not finish within {limit:.0f}s" in result.stderr, result.stderr
        assert "Tasks.Checkpoint" in result.stderr, result.stderr
        assert took < limit + OVERRAN_SETTLE_S + SLACK_S, took
        assert not (tmp_path / "ck").exists()
        # torpor-runc goes on, finds the checkpoint called off, thaws the container
        wait_for(lambda: freezer_state(task_pid(dnode, name)) == "THAWED", timeout=30,
                 what=f"{name} to be thawed")
        assert task_status(dnode, name) == "RUNNING"
        wait_counter_above(dnode, name, max(before, read_counter(dnode, name)) + 3)
        wait_for(lambda: checkpoint_leftovers(dnode) == [], timeout=30,
                 what="the checkpoint's journal, lock and lease to go")
