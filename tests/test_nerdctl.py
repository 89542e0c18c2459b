"""nerdctl with torpor: `nerdctl checkpoint create` and `nerdctl start --checkpoint` of a container
run under torpor-runc bring its state back (an established TCP connection on a CNI network, the
server's memory, a volume, /dev/shm, the counter), on containerd 1.6 and 2.x; `torpor import`
turns nerdctl's checkpoint into a torpor one that another node restores, without nerdctl.

nerdctl (2.3, from packaging/install-deps.sh) runs with its own data root, CNI configuration and
containerd namespace in every test (tests/support/nerdctl.py), and everything it made is removed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from torpor.formats import state as container_state

from .conftest import Nodes, run_torpor
from .support.containerd import Node
from .support.nerdctl import Nerdctl
from .support.processes import wait_for
from .support.registry import Registry
from .support.workload import COUNTER, LineClient, containers, kv_ask, read_counter, wait_kv

pytestmark = pytest.mark.real


@pytest.fixture
def nerd(node: Node, test_image: dict[str, object], container_name: str) -> Iterator[Nerdctl]:
    """nerdctl against the session's node of the versions asked for."""
    nerdctl = Nerdctl(node, container_name[-20:], Path(str(test_image["tar"])))
    try:
        yield nerdctl
    finally:
        nerdctl.close()


def connect(host: str, port: int) -> LineClient | None:
    try:
        return LineClient(host, port, timeout=10)
    except OSError:
        return None


@pytest.mark.parametrize(("containerd_version", "runc_version"), [("1.6", "1.1"), ("2", "1.3")],
                         indirect=True, ids=["containerd1.6-runc1.1", "containerd2-runc1.3"])
def test_checkpoint_create_and_start_bring_the_state_back(
        nerd: Nerdctl, torpor_bin: Path, tmp_path: Path, test_image: dict[str, object]) -> None:
    prefix, _gateway = nerd.bridge("torpor-nerd")
    address = f"{prefix}5"   # pinned: nerdctl's CNI hook gives it back on restore
    volume = tmp_path / "volume"
    volume.mkdir()
    nerd("run", "-d", "--name", "web", "--runtime", str(torpor_bin / "torpor-runc"),
         "--network", "torpor-nerd", "--ip", address,
         "--annotation", "io.torpor.checkpoint.tcp-established=true",
         "-v", f"{volume}:/data", str(test_image["name"]), "sh", "-c",
         f"echo kept > /data/f; echo shm > /dev/shm/f; kvserver 7000 & {COUNTER}")
    client = wait_for(lambda: connect(address, 7000), what="kvserver on nerdctl's bridge")
    assert isinstance(client, LineClient)
    try:
        assert client.ask("SET greeting hello") == "OK"
        before = nerd.wait_counter_above("web", 10)

        assert nerd("checkpoint", "create", "web", "ck1").stdout.strip() == "ck1"
        assert nerd.status("web") == "exited"  # nerdctl stops it by default
        assert nerd("checkpoint", "ls", "web").stdout.split()[-1] == "ck1"
        state = container_state.read(str(nerd.data_root / "checkpoints" / "ck1"))
        assert state is not None  # torpor-runc's state rides in nerdctl's checkpoint
        assert state.container_id == nerd.container_id("web")
        assert state.criu.tcp_established and not state.criu.leave_running
        assert [v.destination for v in state.files.volumes] == ["/data"]
        (volume / "f").unlink()  # as a fresh volume would be

        started = nerd("start", "--checkpoint", "ck1", "web", check=False)
        if started.returncode != 0 and "content digest" in started.stderr \
                and "not found" in started.stderr:
            # seen once in three full runs on containerd 2.1, never alone: the tar of the
            # checkpoint nerdctl 2.3 uploads (taskutil.NewTask) was gone from containerd's
            # content store when the task read it. Nothing of torpor's is in that path; a
            # second start finds it, as a user's would.
            started = nerd("start", "--checkpoint", "ck1", "web", check=False)
        assert started.returncode == 0, started.stderr
        assert client.ask("GET greeting") == "hello"  # the same connection, the same server
        assert client.ask("INCR hits") == "1"
        resumed = nerd.counter("web")
        assert resumed >= before  # from where it was, not from zero
        nerd.wait_counter_above("web", resumed + 3)
        assert (volume / "f").read_text() == "kept\n"
        assert nerd.exec_out("web", "cat", "/dev/shm/f") == "shm\n"
        assert nerd("inspect", "-f", "{{.NetworkSettings.IPAddress}}", "web").stdout.strip() \
            == address
        assert nerd.exec_out("web", "sh", "-c", "echo PING | nc -w5 127.0.0.1 7000") == "PONG\n"
    finally:
        client.close()


@pytest.mark.parametrize("containerd_version", ["2"], indirect=True)
def test_the_shim_name_runtime_does_not_reach_nerdctls_checkpoint(
        nerd: Nerdctl, test_image: dict[str, object]) -> None:
    """nerdctl gives CRIU's options only to io.containerd.runc.v2: under the runtime name
    io.containerd.torpor.v2, `checkpoint create` leaves the container running and `start
    --checkpoint` of a running container only warns. The docs say to use the binary's path."""
    nerd("run", "-d", "--name", "shim", "--runtime", "io.containerd.torpor.v2", "--network",
         "none", str(test_image["name"]), "sh", "-c", COUNTER)
    nerd.wait_counter_above("shim", 5)
    nerd("checkpoint", "create", "shim", "ck1")
    assert nerd.status("shim") == "running"
    started = nerd("start", "--checkpoint", "ck1", "shim")
    assert "is already running" in started.stderr


def test_import_refuses_what_it_cannot_use(nerd: Nerdctl, torpor_bin: Path, tmp_path: Path,
                                           test_image: dict[str, object]) -> None:
    """A checkpoint made without torpor-runc, or of another container, is refused in words."""
    image = str(test_image["name"])
    runtime = ["--runtime", str(torpor_bin / "torpor-runc")]
    nerd("run", "-d", "--name", "plain", "--network", "none", image, "sh", "-c", COUNTER)
    for name in ("t1", "t2"):
        nerd("run", "-d", "--name", name, *runtime, "--network", "none", image, "sh", "-c",
             COUNTER)
    nerd.wait_counter_above("plain", 3)
    nerd("checkpoint", "create", "plain", "ck-plain")
    nerd("checkpoint", "create", "t1", "ck-t1")
    base = ["--namespace", nerd.namespace, "import", "--data-root", str(nerd.data_root)]
    plain = run_torpor(nerd.node, *base, "plain", "ck-plain", "-o", str(tmp_path / "a"),
                       check=False)
    assert plain.returncode != 0
    assert "was not made under torpor-runc" in plain.stderr
    assert "--runtime /path/to/torpor-runc" in plain.stderr
    mixed = run_torpor(nerd.node, *base, "t2", "ck-t1", "-o", str(tmp_path / "b"), check=False)
    assert mixed.returncode != 0
    assert f"is a checkpoint of container {nerd.container_id('t1')[:12]}" in mixed.stderr
    missing = run_torpor(nerd.node, *base, "t2", "ck-none", "-o", str(tmp_path / "c"),
                         check=False)
    assert missing.returncode != 0 and "no checkpoint" in missing.stderr
    assert not any((tmp_path / name).exists() for name in ("a", "b", "c"))


def node_config(session_dir: Path, name: str) -> Path:
    """Each node its own torpor state and image store: two machines, not one."""
    path = session_dir / f"node-{name}.toml"
    path.write_text(f'[runtime]\nstate_dir = "{session_dir}/{name}-state"\n'
                    f'log_dir = "{session_dir}/{name}-state-logs"\n'
                    f'[image]\nstore = "{session_dir}/{name}-store"\n')
    return path


def test_torpor_imports_nerdctls_checkpoint_and_another_node_restores_it(
        nodes: Nodes, session_dir: Path, tmp_path: Path, test_image: dict[str, object]) -> None:
    """nerdctl on containerd 2.x over runc 1.1 checkpoints; torpor imports and pushes; a node
    with containerd 1.6, runc 1.3 and no nerdctl restores it from the registry."""
    a = nodes.start("nerd-a", containerd="2", config=node_config(session_dir, "nerd-a"))
    b = nodes.start("nerd-b", containerd="1.6", runc="1.3",
                    config=node_config(session_dir, "nerd-b"))
    registry = Registry(session_dir / "registries", "nerd").start()
    nerd = Nerdctl(a, "import", Path(str(test_image["tar"])))
    volume, moved = tmp_path / "volume", tmp_path / "volume-b"
    volume.mkdir()
    moved.mkdir()
    ref = f"{registry.host}/team/web:nerdctl-1"
    try:
        with containers(b) as on_b:
            nerd("run", "-d", "--name", "web", "--runtime", str(a.bin_dir / "torpor-runc"),
                 "--network", "none", "-v", f"{volume}:/data", str(test_image["name"]), "sh",
                 "-c", f"echo kept > /data/f; echo shm > /dev/shm/f; "
                 f"kvserver 7000 127.0.0.1 & {COUNTER}")
            wait_for(lambda: nerd.exec_out("web", "sh", "-c", "echo PING | nc -w5 127.0.0.1 "
                                           "7000") == "PONG\n", what="kvserver in web")
            assert nerd.exec_out("web", "sh", "-c", "echo 'SET owner alice' | nc -w5 127.0.0.1 "
                                 "7000") == "OK\n"
            hostname = nerd.exec_out("web", "cat", "/etc/hostname")
            before = nerd.wait_counter_above("web", 10)
            nerd("checkpoint", "create", "web", "ck1")
            saved = nerd.data_root / "checkpoints" / "ck1"
            untouched = {p: p.read_bytes() for p in saved.rglob("*") if p.is_file()}

            out = run_torpor(a, "--namespace", nerd.namespace, "import", "--data-root",
                             str(nerd.data_root), "web", "ck1", "-t", ref, "--push", "--json")
            imported = json.loads(out.stdout)
            assert imported["pushed"].startswith(ref)
            assert imported["dropped_hooks"] >= 1  # nerdctl's own hooks stay on node A
            assert {p: p.read_bytes() for p in saved.rglob("*") if p.is_file()} == untouched
            nerd("rm", "-f", "web")  # nerdctl's files of the container are gone with it

            run_torpor(b, "restore", ref, "--name", "web", "--volume", f"/data={moved}")
            on_b.append("web")
            assert kv_ask(b, "web", "GET owner") == "alice"
            resumed = read_counter(b, "web")
            assert resumed >= before
            wait_kv(b, "web")
            assert (moved / "f").read_text() == "kept\n"
            assert b.ctr("tasks", "exec", "--exec-id", "h", "web", "cat", "/etc/hostname",
                         "/dev/shm/f").stdout == hostname + "shm\n"
            spec = json.loads(b.ctr("containers", "info", "web").stdout)["Spec"]
            hooks = [h["path"] for stage in (spec.get("hooks") or {}).values() for h in stage]
            assert not any("nerdctl" in path for path in hooks)
    finally:
        nerd.close()
        registry.stop()
