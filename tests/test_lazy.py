"""Lazy restore on real containerd, runc, CRIU (criu lazy-pages, userfaultfd) and
docker-registry: the workload runs before its memory is in, and that memory comes out byte for
byte what it was (memhog's checksum of all of it, computed inside the workload before the
checkpoint and after the restore); a registry that goes away mid-stream, or a pack damaged in
it, ends in a clean error with the workload killed and nothing of the restore left. The eager
restore streams too: its CRIU images are rebuilt as the packs arrive, the memory exact, and a
registry gone mid-way leaves nothing."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Nodes, run_torpor
from .support.containerd import Node
from .support.processes import cpu_seconds, parent_of, pids_with_arg, reaped, wait_for
from .support.registry import Registry
from .support.tcp_proxy import ThrottledProxy
from .support.workload import containers, exec_out, read_file, task_status

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]
MIB = 64


def node_config(session_dir: Path, name: str, extra: str = "") -> Path:
    path = session_dir / f"node-{name}.toml"
    path.write_text(f'[runtime]\nstate_dir = "{session_dir}/{name}-state"\n'
                    f'log_dir = "{session_dir}/{name}-state-logs"\n'
                    f'[image]\nstore = "{session_dir}/{name}-store"\n{extra}')
    return path


@pytest.fixture(scope="module")
def lazy_nodes(nodes: Nodes, session_dir: Path) -> tuple[Node, Node]:
    # b's restores give up on a registry that is gone after 5 s (plus 10 s per GiB)
    return (nodes.start("lazy-a", config=node_config(session_dir, "lazy-a")),
            nodes.start("lazy-b", config=node_config(session_dir, "lazy-b",
                                                     "[restore]\ntimeout_s = 5\n")))


@pytest.fixture(scope="module")
def registry(session_dir: Path) -> Iterator[Registry]:
    started = Registry(session_dir / "registries", "lazy").start()
    yield started
    started.stop()


def memhog_sums(node: Node, name: str) -> list[str]:
    """memhog's checksums of its whole memory so far: at its start, then one per SIGUSR1."""
    text = read_file(node, name, "/tmp/sums")
    return [line.rsplit(" ", 1)[1] for line in text.splitlines() if "checksum" in line]


def ask_sum(node: Node, name: str) -> str:
    before = len(memhog_sums(node, name))
    exec_out(node, name, "sh", "-c", "kill -USR1 $(pidof memhog)")
    wait_for(lambda: len(memhog_sums(node, name)) > before, what="memhog's checksum")
    return memhog_sums(node, name)[-1]


def start_memhog(node: Node, image: str, name: str, mib: int) -> str:
    """memhog holding `mib` MiB of bytes of its own (seeded by the name: no other test's packs
    hold them), its first checksum."""
    seed = int.from_bytes(name.encode()[:7], "little")
    node.ctr("run", "-d", *SHIM, image, name, "sh", "-c",
             f"memhog {mib} -x {seed} > /tmp/sums 2>&1")
    wait_for(lambda: memhog_sums(node, name), timeout=60, what="memhog to fill its memory")
    return memhog_sums(node, name)[0]


def left_behind(node: Node, session_dir: Path, name: str) -> list[str]:
    """What a failed restore must not leave: its container, its work directory."""
    found = [line for line in node.ctr("containers", "ls", "-q").stdout.split() if line == name]
    work = session_dir / "lazy-b-state" / "restore-work"
    return found + ([str(p) for p in work.iterdir() if f"-{name}-" in p.name]
                    if work.is_dir() else [])


def test_a_lazily_restored_workload_runs_on_its_exact_memory(
        lazy_nodes: tuple[Node, Node], registry: Registry, test_image: dict[str, object]) -> None:
    a, b = lazy_nodes
    name = "lazy-sum"
    ref = f"{registry.host}/lazy/{name}:1"
    with containers(a) as on_a, containers(b) as on_b:
        on_a.append(name)
        at_start = start_memhog(a, str(test_image["name"]), name, MIB)
        assert ask_sum(a, name) == at_start
        run_torpor(a, "checkpoint", name, "-t", ref, "--push")
        on_b.append(name)
        done = json.loads(run_torpor(b, "restore", ref, "--lazy", "--json").stdout)
        # it ran before its memory was in, and the memory came from the registry's packs
        assert done["timings"]["running_s"] < done["timings"]["total_s"], done
        timings = done["timings"]   # over half of it, compressed: by range or from the download
        assert timings["lazy_remote_bytes"] + timings["lazy_streamed_bytes"] > MIB << 19, done
        assert timings["lazy_streamed_bytes"] > 0, done   # the packs' download behind it
        assert ask_sum(b, name) == at_start   # every byte of its memory as it was
        assert "memhog" in exec_out(b, name, "ps")
        # what it fetched is kept: the image is in b's store, whole, and a second lazy restore
        # of it reads every chunk here
        stored = json.loads(run_torpor(b, "ls", "--json").stdout)
        assert ref in [e["ref"] for e in stored], stored
        assert done["timings"]["keep_s"] >= 0, done
        on_b.append(f"{name}-2")
        again = json.loads(run_torpor(b, "restore", ref, "--lazy", "--name", f"{name}-2",
                                      "--json").stdout)
        assert again["timings"]["lazy_remote_bytes"] == 0, again
        assert again["timings"]["lazy_streamed_bytes"] == 0, again
        assert again["timings"]["lazy_local_bytes"] > 0, again
        assert ask_sum(b, f"{name}-2") == at_start


def restore_until(node: Node, line: str, *args: str) -> tuple[subprocess.Popen[str], list[str]]:
    """`torpor restore ARGS` on `node` in a process of its own (no torpord), what it said up to
    the first line holding `line` (or its end)."""
    restore = subprocess.Popen([str(node.bin_dir / "torpor"), "restore", *args],
                               env={**node.env, "TORPOR_NO_SERVICE": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert restore.stdout is not None
    said = []
    for said_line in restore.stdout:
        said.append(said_line)
        if line in said_line:
            break
    return restore, said


@contextlib.contextmanager
def arriving(nodes: tuple[Node, Node], registry: Registry, image: str, name: str,
             ) -> Iterator[tuple[subprocess.Popen[str], list[str], ThrottledProxy]]:
    """`name` checkpointed on a and restored on b with --lazy through a slow proxy to the
    registry, stopped at the moment the workload runs and its memory is arriving: the restore
    (in-process, no torpord), what it said so far, the proxy."""
    a, b = nodes
    repo = f"lazy/{name}:1"
    proxy = ThrottledProxy(int(registry.host.rsplit(":", 1)[1]), 8 << 20)
    try:
        # a test that failed midway: the restore it started ends before b's state goes
        with containers(a) as on_a, containers(b) as on_b, reaped() as started:
            on_a.append(name)
            start_memhog(a, image, name, MIB)
            run_torpor(a, "checkpoint", name, "-t", f"{registry.host}/{repo}", "--push")
            on_b.append(name)
            restore, said = restore_until(b, "its memory is arriving", f"{proxy.host}/{repo}",
                                          "--lazy")
            started.append(restore)
            assert "its memory is arriving" in "".join(said), said
            yield restore, said, proxy
    finally:
        proxy.close()


def lazy_restores(node: Node) -> list[dict[str, object]]:
    return list(json.loads(run_torpor(node, "ls", "--restores", "--json").stdout))


def restoring(node: Node, ref: str) -> list[dict[str, object]]:
    return list(json.loads(run_torpor(node, "inspect", ref, "--json").stdout)["restoring"])


def test_torpor_ls_and_inspect_show_how_much_memory_is_in(
        lazy_nodes: tuple[Node, Node], registry: Registry, test_image: dict[str, object]) -> None:
    """While the memory arrives, `torpor ls` says how much of it is in, and so does `torpor
    inspect` of the image, by another name for it than the restore's (the registry itself, not
    the proxy the restore goes through); once it is all in, neither shows the restore."""
    b = lazy_nodes[1]
    name = "lazy-progress"
    ref = f"{registry.host}/lazy/{name}:1"
    with arriving(lazy_nodes, registry, str(test_image["name"]), name) as (restore, said, _):
        wait_for(lambda: lazy_restores(b), what="the lazy restore in torpor ls")
        [seen] = lazy_restores(b)
        assert seen["container"] == name and str(seen["source"]).endswith(f"lazy/{name}:1")
        assert seen["source"] != ref, seen
        assert 0 <= int(seen["placed_bytes"]) < int(seen["lazy_bytes"]), seen  # type: ignore[call-overload]
        assert int(seen["lazy_bytes"]) > MIB << 19, seen  # type: ignore[call-overload]
        listed = run_torpor(b, "ls").stdout
        assert "lazy restores under way:" in listed and name in listed, listed
        [inspected] = restoring(b, ref)
        assert inspected["container"] == name, inspected
        assert int(inspected["placed_bytes"]) < int(inspected["lazy_bytes"]), inspected  # type: ignore[call-overload]
        shown = run_torpor(b, "inspect", ref).stdout
        assert f"restoring    lazily here as {name} " in shown, shown
        said.append(restore.communicate(timeout=180)[0])
        assert restore.returncode == 0, "".join(said)
        assert lazy_restores(b) == [] and restoring(b, ref) == []


def lazy_pages_daemon(restore: subprocess.Popen[str]) -> int:
    """The pid of the `criu lazy-pages` this (in-process) restore started."""
    for pid in pids_with_arg("lazy-pages"):
        with contextlib.suppress(OSError):
            if parent_of(pid) == restore.pid:
                return pid
    raise AssertionError(f"no criu lazy-pages under torpor restore (pid {restore.pid})")


def test_criu_lazy_pages_sleeps_while_the_memory_arrives(
        lazy_nodes: tuple[Node, Node], registry: Registry, test_image: dict[str, object]) -> None:
    """While the workload runs and its pages wait on a slow registry, `criu lazy-pages` leaves
    the node's CPU to the workload and the download (torpor's CRIU build: stock CRIU 4.2 spins
    on a core, packaging/criu/lazy-pages-wait.patch)."""
    name = "lazy-asleep"
    with arriving(lazy_nodes, registry, str(test_image["name"]), name) as (restore, said, _):
        daemon = lazy_pages_daemon(restore)
        spent, started = cpu_seconds(daemon), time.monotonic()
        time.sleep(2.0)   # 64 MiB at 8 MiB/s: the pages are still arriving
        spent, took = cpu_seconds(daemon) - spent, time.monotonic() - started
        assert restore.poll() is None, "the lazy restore ended before it was measured"
        assert spent < 0.25 * took, f"criu lazy-pages used {spent:.2f} s of CPU in {took:.2f} s"
        said.append(restore.communicate(timeout=180)[0])
        assert restore.returncode == 0, "".join(said)
        assert lazy_restores(lazy_nodes[1]) == []


def test_a_registry_gone_mid_stream_kills_the_workload_and_leaves_nothing(
        lazy_nodes: tuple[Node, Node], registry: Registry, test_image: dict[str, object],
        session_dir: Path) -> None:
    name = "lazy-cut"
    with arriving(lazy_nodes, registry, str(test_image["name"]), name) as (restore, said, proxy):
        proxy.close()   # the registry is gone, the workload running
        said.append(restore.communicate(timeout=120)[0])
        text = "".join(said)
        assert restore.returncode != 0, text
        assert "killed" in text and "deadline" in text, text
        assert left_behind(lazy_nodes[1], session_dir, name) == [], text


def test_torpor_killed_mid_stream_takes_the_workload_with_it(
        lazy_nodes: tuple[Node, Node], registry: Registry, test_image: dict[str, object]) -> None:
    """torpor itself killed while the memory arrives: its guard kills the workload before the
    page source closes, so it never runs on with the zeros the kernel would give it."""
    b = lazy_nodes[1]
    name = "lazy-orphan"
    with arriving(lazy_nodes, registry, str(test_image["name"]), name) as (restore, _, _proxy):
        assert task_status(b, name) == "RUNNING"
        restore.kill()
        restore.wait(30)
        wait_for(lambda: task_status(b, name) != "RUNNING", timeout=30,
                 what="the orphaned workload to be killed")
        assert task_status(b, name) == "STOPPED"
        assert lazy_restores(b) == []   # its record went with it


def test_a_damaged_pack_is_refused_before_its_bytes_are_used(
        lazy_nodes: tuple[Node, Node], registry: Registry, test_image: dict[str, object],
        session_dir: Path) -> None:
    a, b = lazy_nodes
    name = "lazy-damaged"
    ref = f"{registry.host}/lazy/{name}:1"
    with containers(a) as on_a, containers(b) as on_b:
        on_a.append(name)
        start_memhog(a, str(test_image["name"]), name, MIB)
        run_torpor(a, "checkpoint", name, "-t", ref, "--push")
        packs = sorted(((registry.blob_data(d).stat().st_size, d)
                        for d in registry.layer_digests(f"lazy/{name}", "1")), reverse=True)
        data = registry.blob_data(packs[0][1])   # the largest blob: a pack of memory
        with open(data, "r+b") as f:
            f.seek(packs[0][0] // 2)
            byte = f.read(1)
            f.seek(packs[0][0] // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
        on_b.append(name)
        failed = run_torpor(b, "restore", ref, "--lazy", check=False)
        text = failed.stdout + failed.stderr
        assert failed.returncode != 0, text
        assert "damaged" in text and packs[0][1] in text, text
        assert left_behind(b, session_dir, name) == [], text


def test_an_eager_restore_rebuilds_the_memory_as_the_packs_arrive(
        lazy_nodes: tuple[Node, Node], registry: Registry, test_image: dict[str, object],
        session_dir: Path) -> None:
    """Without --lazy, through a registry slowed to 16 MiB/s: the CRIU images are rebuilt
    beside the download, and the memory is byte for byte what it was. Then the same restore
    with the registry gone while the packs arrive: a clean error, nothing of it left, and no
    half image in the store."""
    a, b = lazy_nodes
    name = "eager-stream"
    repo = f"lazy/{name}:1"
    proxy = ThrottledProxy(int(registry.host.rsplit(":", 1)[1]), 16 << 20)
    try:
        with containers(a) as on_a, containers(b) as on_b:
            on_a.append(name)
            at_start = start_memhog(a, str(test_image["name"]), name, MIB)
            run_torpor(a, "checkpoint", name, "-t", f"{registry.host}/{repo}", "--push")
            on_b.append(name)
            done = run_torpor(b, "restore", f"{proxy.host}/{repo}")
            assert "rebuilding the CRIU images as" in done.stderr, done.stderr
            assert ask_sum(b, name) == at_start
            run_torpor(b, "rm", f"{proxy.host}/{repo}")
    finally:
        proxy.close()
    cut = f"{name}-cut"
    proxy = ThrottledProxy(int(registry.host.rsplit(":", 1)[1]), 8 << 20)
    restore: subprocess.Popen[str] | None = None
    try:
        restore, said = restore_until(b, "rebuilding the CRIU images as", f"{proxy.host}/{repo}",
                                      "--name", cut)
        proxy.close()     # the registry gone while the packs arrive
        said.append(restore.communicate(timeout=120)[0])
    finally:
        proxy.close()
        if restore is not None and restore.poll() is None:
            restore.kill()
            restore.wait()
    text = "".join(said)
    assert restore.returncode == 1, text
    # the registry's own words, not the rebuild's missing file
    assert f"registry {proxy.host}" in text and "No such file" not in text, text
    assert left_behind(b, session_dir, cut) == [], text
    stored = json.loads(run_torpor(b, "ls", "--json").stdout)
    assert f"{proxy.host}/{repo}" not in [e["ref"] for e in stored], stored
