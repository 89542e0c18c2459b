"""Never lose a workload: a checkpoint that fails or is killed at any step leaves the container
running with its state, or a complete checkpoint that restores it (docs/checkpoint.md, "When a
checkpoint fails"). Real containerd, runc, CRIU and docker-registry; the faults are real too:
SIGKILL of `torpor`, full filesystems (small tmpfs mounts), a containerd restart, a registry
that drops connections or is gone, a credential helper that does not exist.

Each case asserts what a user sees: the container runs and counts on from where it was, never
frozen, or the checkpoint is complete and `torpor restore` brings the counter back; and nothing
is left behind: no journal, lock, scratch space, record directory or containerd lease.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import Nodes
from .support.containerd import Node
from .support.crash_disk import crash_disk
from .support.processes import reaped, stop, wait_for
from .support.registry import Registry, docker_config
from .support.tcp_proxy import DroppingProxy
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
LOST: list[str] = []  # containers neither running nor restorable: must stay empty


@pytest.fixture(scope="module")
def fnode(nodes: Nodes, session_dir: Path, containerd_version: str, runc_version: str) -> Node:
    """A containerd of its own (one test restarts it), with its own state dir and store, of
    the versions the session asks for (`pytest --containerd 2 --runc 1.3`)."""
    config = session_dir / "faults.toml"
    config.write_text(f'[runtime]\nstate_dir = "{session_dir}/faults-state"\n'
                      f'log_dir = "{session_dir}/faults-state-logs"\n'
                      f'[image]\nstore = "{session_dir}/faults-store"\n')
    return nodes.start("faults", config=config, containerd=containerd_version, runc=runc_version)


@pytest.fixture(scope="module")
def registry(session_dir: Path) -> Iterator[Registry]:
    started = Registry(session_dir / "faults-registry", "plain").start()
    yield started
    started.stop()


def state_dir(node: Node) -> Path:
    return node.root.parent.parent / "faults-state"


def store_dir(node: Node) -> Path:
    return node.root.parent.parent / "faults-store"


def torpor(node: Node, *args: str, check: bool = True, env: dict[str, str] | None = None,
           timeout: float = 180) -> subprocess.CompletedProcess[str]:
    cmd = [str(node.bin_dir / "torpor"), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, env={**node.env, **(env or {})},
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n"
                             f"{result.stdout}{result.stderr}")
    return result


def start_torpor(node: Node, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(node.bin_dir / "torpor"), *args], env=node.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@contextlib.contextmanager
def held(node: Node, step: str, timeout: float | None = None) -> Iterator[Callable[[], int]]:
    """Hold the checkpoint at `step` (the test-hold marker torpor checks; it gives up after
    `timeout` seconds, 120 unless told); yields a function that waits until it is there and
    returns the pid holding."""
    marker = state_dir(node) / "test-hold" / step
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("" if timeout is None else str(timeout))
    pid_file = Path(f"{marker}.pid")

    def reached() -> int:
        wait_for(pid_file.exists, timeout=60, what=f"the checkpoint to reach {step}")
        return int(pid_file.read_text())

    try:
        yield reached
    finally:
        marker.unlink(missing_ok=True)
        pid_file.unlink(missing_ok=True)


def counter(node: Node, names: list[str], name: str) -> int:
    names.append(name)
    node.ctr("run", "-d", *SHIM, "--label", "torpor-test=never-lose", "localhost/torpor-test/busybox:1",
             name, "sh", "-c", COUNTER)
    return wait_counter_above(node, name, 5)


def assert_runs_on(node: Node, name: str, before: int) -> None:
    """Running, thawed, counting on from where it was."""
    if task_status(node, name) != "RUNNING":
        LOST.append(name)
    assert task_status(node, name) == "RUNNING"
    assert freezer_state(task_pid(node, name)) == "THAWED"
    assert read_counter(node, name) >= before
    wait_counter_above(node, name, read_counter(node, name) + 3)


def assert_restores(node: Node, source: str, name: str, before: int, names: list[str]) -> None:
    """The checkpoint is complete: restored under a new name, the counter goes on."""
    names.append(name)
    result = torpor(node, "restore", source, "--name", name, check=False)
    if result.returncode != 0:
        LOST.append(name)
    assert result.returncode == 0, result.stderr
    restored = read_counter(node, name)
    assert restored >= before
    wait_counter_above(node, name, restored + 3)


def leftovers(node: Node) -> list[str]:
    """Everything a finished checkpoint must not leave: journals, locks, scratch, records of
    stopped containers, containerd leases."""
    found = [str(p) for p in (state_dir(node) / "checkpoints").glob("*") if p.name != "locks"]
    found += [str(p) for p in (state_dir(node) / "checkpoints" / "locks").glob("*")]
    found += [str(p) for p in (store_dir(node) / "journals").glob("*")]
    found += [str(p) for p in (store_dir(node) / "kept").glob("*")]
    found += [str(p) for p in (store_dir(node) / "scratch").glob("*")]
    found += [f"lease {lease}" for lease in node.ctr("leases", "ls", "-q").stdout.split()]
    return found


def recover(node: Node) -> list[dict[str, str]]:
    done = json.loads(torpor(node, "recover", "--json").stdout)
    assert isinstance(done, list)
    return done


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)


# SIGKILL of `torpor checkpoint` at each step ---------------------------------------------------

KILL_AT = {
    # step held -> (where the hold is, the target's flags)
    "requested": ("cli", ["-o", "{tmp}/ck"]),             # before the dump
    "frozen": ("runtime", ["-o", "{tmp}/ck"]),            # during it: torpor-runc froze it
    "dumped": ("cli", ["-o", "{tmp}/ck"]),                # after it: CRIU holds the dump
    "compressing": ("cli", ["-t", "localhost/faults/c:1"]),
    "pushing": ("cli", ["-t", "{registry}/faults/c:1", "--push"]),
}


@pytest.mark.parametrize("step", list(KILL_AT))
def test_sigkill_of_torpor_at_each_step(fnode: Node, registry: Registry, tmp_path: Path,
                                        step: str) -> None:
    _, flags = KILL_AT[step]
    args = [f.format(tmp=tmp_path, registry=registry.host) for f in flags]
    with containers(fnode) as names, reaped() as started:
        name = f"kill-{step}"
        before = counter(fnode, names, name)
        with held(fnode, step) as reached:
            cli = start_torpor(fnode, "checkpoint", name, *args)
            started.append(cli)
            reached()
            kill(cli)
        # the next torpor finishes what the killed one left: the container runs on
        done = recover(fnode)
        assert [d["outcome"] for d in done if d["container"] == name] == ["rolled back"], done
        assert_runs_on(fnode, name, before)
        assert not (tmp_path / "ck").exists()
        assert "faults/c:1" not in torpor(fnode, "ls").stdout
        assert leftovers(fnode) == []


def test_sigkill_after_the_commit_keeps_the_checkpoint(fnode: Node, tmp_path: Path) -> None:
    """Killed once CRIU was told to stop the container: the checkpoint is whole and restores."""
    with containers(fnode) as names, reaped() as started:
        before = counter(fnode, names, "kill-committed")
        with held(fnode, "committed") as reached:
            cli = start_torpor(fnode, "checkpoint", "kill-committed", "-o", str(tmp_path / "ck"))
            started.append(cli)
            reached()
            kill(cli)
        done = recover(fnode)
        assert [d["outcome"] for d in done] == ["complete"], done
        assert task_status(fnode, "kill-committed") == "STOPPED"
        assert leftovers(fnode) == []
        assert_restores(fnode, str(tmp_path / "ck"), "kill-committed-b", before, names)
        # a restore that fails leaves no record directory either
        core = next((tmp_path / "ck" / "criu").glob("core-*.img"))
        core.write_bytes(b"\xff" * core.stat().st_size)
        names.append("kill-committed-c")
        failed = torpor(fnode, "restore", str(tmp_path / "ck"), "--name", "kill-committed-c",
                        check=False)
        assert failed.returncode != 0
        assert not list((state_dir(fnode) / "containers").glob("*/kill-committed-c.*"))


# A killed checkpoint never stops its container later ---------------------------------------------

LATE = {
    # where the checkpoint is when its `torpor` is killed -> how long CRIU's hook holds
    "runtime-start": None,  # containerd has the call in flight; torpor-runc has not begun
    "writing": 4.0,         # CRIU holds the dumped container in its hook, which goes on (its
                            # own hold times out) only after the recovery
}


@pytest.mark.parametrize("step", list(LATE))
def test_a_killed_checkpoint_never_stops_its_container_later(fnode: Node, tmp_path: Path,
                                                             step: str) -> None:
    """`torpor checkpoint` SIGKILLed, `torpor recover` run at once, then the runtime (or CRIU's
    hook) goes on after the recovery, past every timeout: the container still runs and counts
    (a container once found stopped two minutes after such a recovery, issue 20)."""
    hook_hold = LATE[step]
    with containers(fnode) as names, reaped() as started, contextlib.ExitStack() as holds:
        name = f"late-{step}"
        before = counter(fnode, names, name)
        if hook_hold is not None:
            holds.enter_context(held(fnode, "post-dump", timeout=hook_hold))
        reached = holds.enter_context(held(fnode, step))
        cli = start_torpor(fnode, "checkpoint", name, "-o", str(tmp_path / "ck"))
        started.append(cli)
        reached()
        kill(cli)
        done = recover(fnode)  # while the runtime, or CRIU's hook, still waits
        assert [d["outcome"] for d in done if d["container"] == name] == ["rolled back"], done
        holds.close()
        time.sleep((hook_hold or 0) + 6)  # the runtime went on; any late stop has happened now
        assert_runs_on(fnode, name, before)
        assert not (tmp_path / "ck").exists()
        assert recover(fnode) == []
        assert leftovers(fnode) == []


# A power loss -------------------------------------------------------------------------------------

def test_a_power_loss_after_the_commit_leaves_a_checkpoint_that_restores(
        fnode: Node, tmp_path: Path) -> None:
    """The commit stopped the container; the node loses power before the kernel wrote the page
    cache out (a disk that keeps only what was synced, tests/support/crash_disk.py): the
    checkpoint on the disk, as the power loss left it, is whole and restores."""
    with containers(fnode) as names, crash_disk(tmp_path / "crash") as disk:
        before = counter(fnode, names, "power-loss")
        torpor(fnode, "checkpoint", "power-loss", "-o", str(disk.mount / "ck"))
        assert task_status(fnode, "power-loss") == "STOPPED"
        after = disk.crash()
        assert (after / "ck" / "checkpoint.json").exists()
        assert_restores(fnode, str(after / "ck"), "power-loss-b", before, names)
        assert leftovers(fnode) == []


def test_a_power_loss_while_criu_holds_the_dump_leaves_the_dump_whole(
        fnode: Node, tmp_path: Path) -> None:
    """Before the commit, CRIU holding the dumped container: a power loss now finds CRIU's
    images whole on the disk (synced at post-dump, so a kept dump is a real one); the killed
    checkpoint then rolls back and the container runs on."""
    with containers(fnode) as names, crash_disk(tmp_path / "crash") as disk, \
            reaped() as started:
        name = "power-loss-held"
        before = counter(fnode, names, name)
        with held(fnode, "writing") as reached:
            cli = start_torpor(fnode, "checkpoint", name, "-o", str(disk.mount / "ck"))
            started.append(cli)
            reached()
            live = {p.name: p.read_bytes() for p in (disk.mount / "ck" / "criu").iterdir()}
            after = disk.crash()
            kill(cli)
        crashed = {p.name: p.read_bytes() for p in (after / "ck" / "criu").iterdir()}
        assert "torpor-state.json" in crashed and any(n.startswith("pages-") for n in crashed)
        assert {n: len(b) for n, b in crashed.items()} == {n: len(b) for n, b in live.items()}
        assert crashed == live
        done = recover(fnode)
        assert [d["outcome"] for d in done if d["container"] == name] == ["rolled back"], done
        assert_runs_on(fnode, name, before)
        assert leftovers(fnode) == []


# Full filesystems --------------------------------------------------------------------------------

@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> None:
    """Write until the filesystem is full."""
    with open(directory / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * (1 << 16))


@pytest.mark.parametrize("stage", ["dump", "metadata", "compression"])
def test_a_full_disk_at_each_stage(fnode: Node, tmp_path: Path, stage: str) -> None:
    with containers(fnode) as names, tmpfs(tmp_path / "small", "64k" if stage != "metadata"
                                           else "16m") as small, reaped() as started:
        name = f"full-{stage}"
        before = counter(fnode, names, name)
        if stage == "dump":        # CRIU's images do not fit
            result = torpor(fnode, "checkpoint", name, "-o", str(small / "ck"), check=False)
        elif stage == "metadata":  # the disk fills up while CRIU holds the dumped container
            with held(fnode, "writing") as reached:
                cli = start_torpor(fnode, "checkpoint", name, "-o", str(small / "ck"))
                started.append(cli)
                reached()
                fill(small)
            out, err = cli.communicate(timeout=120)
            result = subprocess.CompletedProcess(cli.args, cli.returncode, out, err)
        else:                      # the layers do not fit (the dump is in the store)
            result = torpor(fnode, "checkpoint", name, "-o", str(small / "layout"), "--oci",
                            check=False)
        assert result.returncode != 0
        assert "No space left on device" in result.stderr, result.stderr
        assert f"{name} runs on, as before" in result.stderr, result.stderr
        assert_runs_on(fnode, name, before)
        assert sorted(p.name for p in small.iterdir()) == (["filler"] if stage == "metadata"
                                                           else [])
        assert leftovers(fnode) == []


# containerd, the registry, credentials ---------------------------------------------------------

def restart_containerd(node: Node) -> None:
    assert node.proc is not None
    stop(node.proc)  # by pid; its shims and containers live on
    node.start()


@pytest.mark.parametrize("step", ["frozen", "dumped"])
def test_containerd_restart_mid_checkpoint(fnode: Node, tmp_path: Path, step: str) -> None:
    """Restarted while torpor-runc holds the container frozen, or while CRIU holds its dump."""
    with containers(fnode) as names, reaped() as started:
        name = f"restart-{step}"
        before = counter(fnode, names, name)
        with held(fnode, step) as reached:
            cli = start_torpor(fnode, "checkpoint", name, "-o", str(tmp_path / "ck"))
            started.append(cli)
            reached()
            restart_containerd(fnode)
        _, err = cli.communicate(timeout=120)
        recover(fnode)
        if step == "dumped":  # CRIU held the whole dump: containerd is not needed to finish
            assert cli.returncode == 0, err
        if cli.returncode == 0:  # the checkpoint completed: CRIU stopped the container
            assert task_status(fnode, name) == "STOPPED"
            assert_restores(fnode, str(tmp_path / "ck"), f"{name}-b", before, names)
        else:                    # it did not: the container runs on, as before
            assert f"{name} runs on" in err, err
            assert_runs_on(fnode, name, before)
            assert not (tmp_path / "ck").exists()
        assert leftovers(fnode) == []


def test_the_registry_drops_the_connection(fnode: Node, registry: Registry) -> None:
    """An upload cut off midway resumes: the checkpoint completes, pushed and kept locally."""
    proxy = DroppingProxy(registry.port, nth=1, method=b"PUT", body_bytes=100)
    ref = f"{proxy.host}/faults/dropped:1"
    try:
        with containers(fnode) as names:
            before = counter(fnode, names, "dropped")
            torpor(fnode, "checkpoint", "dropped", "-t", ref, "--push")
            assert proxy.dropped
            assert task_status(fnode, "dropped") == "STOPPED"
            assert leftovers(fnode) == []
            assert_restores(fnode, ref, "dropped-b", before, names)
    finally:
        proxy.close()


def test_a_failed_pull_leaves_the_local_copy_as_it_was(fnode: Node, registry: Registry,
                                                        tmp_path: Path) -> None:
    ref = f"{registry.host}/faults/pulled:1"
    with containers(fnode) as names:
        before = counter(fnode, names, "pulled")
        torpor(fnode, "checkpoint", "pulled", "-t", ref, "--push", "--leave-running")
        listed = json.loads(torpor(fnode, "ls", "--json").stdout)
        here = {p.name for p in (Path(listed[0]["layout"]) / "blobs" / "sha256").iterdir()}
        # a newer generation under the same tag, in the registry only: a pull fetches just the
        # blobs the store lacks (the others are linked), so one of those is the one to rot
        newer = tmp_path / "newer"
        torpor(fnode, "checkpoint", "pulled", "-o", str(newer), "--oci", "--leave-running")
        torpor(fnode, "push", str(newer), ref)
        # the registry's copy of every blob the store lacks rots: whichever the pull fetches is
        # damaged (how many there are varies with what the container's memory changed)
        lacking = [p for p in (newer / "blobs" / "sha256").iterdir()
                   if p.name not in here and not _is_json(p)]  # layers: the registry parses
        assert lacking                                         # manifests itself
        for blob in lacking:
            damaged = registry.blob_data(f"sha256:{blob.name}")
            damaged.write_bytes(bytes(b ^ 0xFF for b in damaged.read_bytes()))
        result = torpor(fnode, "pull", ref, check=False)
        assert result.returncode != 0 and "digest" in result.stderr, result.stderr
        assert json.loads(torpor(fnode, "ls", "--json").stdout) == listed
        assert leftovers(fnode) == []
        assert_restores(fnode, ref, "pulled-b", before, names)  # from the local copy
        torpor(fnode, "rm", ref)


def _is_json(path: Path) -> bool:
    try:
        json.loads(path.read_bytes())
        return True
    except ValueError:
        return False


def test_the_registry_is_gone_mid_push(fnode: Node, tmp_path: Path) -> None:
    with containers(fnode) as names:
        before = counter(fnode, names, "no-registry")
        result = torpor(fnode, "checkpoint", "no-registry", "-t", "127.0.0.1:9/faults/gone:1",
                        "--push", check=False)
        assert result.returncode != 0
        # refused before the dump (issue 24): the registry is asked first
        assert "no-registry was not touched" in result.stderr, result.stderr
        assert_runs_on(fnode, "no-registry", before)
        assert "faults/gone" not in torpor(fnode, "ls").stdout
        assert leftovers(fnode) == []


def test_a_missing_credential_helper_fails_before_the_dump(fnode: Node, registry: Registry,
                                                           tmp_path: Path) -> None:
    config = docker_config(tmp_path / "docker", cred_helpers={registry.host: "torpor-missing"})
    with containers(fnode) as names:
        before = counter(fnode, names, "no-helper")
        pid = task_pid(fnode, "no-helper")
        result = torpor(fnode, "checkpoint", "no-helper", "-t", f"{registry.host}/faults/h:1",
                        "--push", check=False, env={"DOCKER_CONFIG": str(config.parent)})
        assert result.returncode != 0
        assert "docker-credential-torpor-missing" in result.stderr, result.stderr
        assert task_pid(fnode, "no-helper") == pid  # never stopped, never restored
        assert_runs_on(fnode, "no-helper", before)
        assert leftovers(fnode) == []


def test_no_workload_was_lost(fnode: Node) -> None:
    """The figure the issue asks for: containers neither running nor restorable (goal 0); and
    with every test container gone, no record directory is left."""
    assert LOST == []
    assert not list((state_dir(fnode) / "containers").glob("*/*"))
