"""Checkpoint and restore whole containers through torpor's CLI and through ctr, on real
containerd, runc and CRIU: memory, TCP connections, network identity and files come back."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import run_torpor
from .support import subnets
from .support.containerd import Node
from .support.netns import NetNS, veth_pair
from .support.processes import printed, reaped, wait_for
from .support.workload import (
    COUNTER,
    LineClient,
    containers,
    exec_out,
    freezer_state,
    kv_ask,
    read_counter,
    read_file,
    task_pid,
    task_status,
    wait_counter_above,
    wait_kv,
)

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]


NETWORK_LOCK_IPTABLES, NETWORK_LOCK_SKIP = 0, 2   # CRIU's enum NETWORK_LOCK_METHOD


def network_lock_of(checkpoint: Path) -> int:
    """The network lock CRIU held during the dump, and holds again during every restore of it
    (its inventory records the method)."""
    from torpor.criu_images.reader import read_one

    inventory = read_one(str(checkpoint / "criu" / "inventory.img"), "INVENTORY",
                         "inventory_entry")
    return int(inventory.network_lock_method)


def runc_binary(torpor_bin: Path) -> list[str]:
    return ["--runtime", "io.containerd.runc.v2", "--runc-binary", str(torpor_bin / "torpor-runc")]


@pytest.mark.parametrize("leave_running", [True, False], ids=["leave-running", "stop"])
def test_counter_continues(node: Node, torpor_bin: Path, tmp_path: Path,
                           test_image: dict[str, object], leave_running: bool) -> None:
    name = f"counter-{'lr' if leave_running else 'stop'}"
    with containers(node) as names:
        names += [name, f"{name}-b"]
        node.ctr("run", "-d", *(runc_binary(torpor_bin) if leave_running else SHIM),
                 str(test_image["name"]), name, "sh", "-c", COUNTER)
        before = wait_counter_above(node, name, 20)
        flags = ["--leave-running"] if leave_running else []
        result = run_torpor(node, "checkpoint", name, "-o", str(tmp_path / "ck"), *flags, "--json")
        summary = json.loads(result.stdout)
        assert summary["sizes"]["memory_pages"] > 0
        if leave_running:
            assert task_status(node, name) == "RUNNING"
            wait_counter_above(node, name, before + 5)  # the original goes on counting
        else:
            assert task_status(node, name) == "STOPPED"
        checkpointed = json.loads((tmp_path / "ck" / "checkpoint.json").read_text())
        assert checkpointed["container"]["id"] == name
        # no TCP connection dumped: no iptables lock on the dump nor on its restores
        assert network_lock_of(tmp_path / "ck") == NETWORK_LOCK_SKIP
        run_torpor(node, "restore", str(tmp_path / "ck"), "--name", f"{name}-b")
        resumed = read_counter(node, f"{name}-b")
        assert resumed >= before  # from where it was, not from zero
        wait_counter_above(node, f"{name}-b", resumed + 5)
        assert (tmp_path / "ck" / "checkpoint.json").read_text() == json.dumps(
            checkpointed, indent=1, sort_keys=True)  # the checkpoint is only read


@contextlib.contextmanager
def kvserver_on_veth(node: Node, test_image: dict[str, object],
                     name: str) -> Iterator[tuple[NetNS, LineClient, str]]:
    """kvserver in container `name`, in a network namespace of its own that the host reaches
    over a veth (NET.1 here, NET.2 there, on a subnet reserved for the test), a client
    connected to it, and its address; all removed after."""
    with subnets.reserved() as (subnet,):
        yield from _kvserver_on_veth(node, test_image, name, subnet.net)


def _kvserver_on_veth(node: Node, test_image: dict[str, object], name: str,
                      net: str) -> Iterator[tuple[NetNS, LineClient, str]]:
    netns = NetNS("torpor-ctr")
    host_if, _ = veth_pair(None, f"{net}.1/24", netns, f"{net}.2/24")
    try:
        with containers(node) as names:
            names.append(name)
            node.ctr("run", "-d", *SHIM, "--with-ns", f"network:{netns.path}",
                     str(test_image["name"]), name, "kvserver", "7000")
            client = wait_for(lambda: _connect(f"{net}.2", 7000), what="kvserver on the veth")
            assert isinstance(client, LineClient)
            yield netns, client, f"{net}.2"
    finally:
        netns.delete()
        from .support.netns import ip

        ip("link", "delete", host_if, check=False)


def test_established_tcp_connection_survives(node: Node, tmp_path: Path,
                                             test_image: dict[str, object]) -> None:
    with kvserver_on_veth(node, test_image, "tcp-kv") as (netns, client, server):
        assert client.ask("SET greeting hello") == "OK"
        assert client.ask("INCR hits") == "1"
        run_torpor(node, "checkpoint", "tcp-kv", "-o", str(tmp_path / "ck"),
                   "--tcp-established")
        # the connection is dumped in repair mode: CRIU's lock holds the namespace still
        assert network_lock_of(tmp_path / "ck") == NETWORK_LOCK_IPTABLES
        node.ctr("tasks", "delete", "tcp-kv")
        node.ctr("containers", "delete", "tcp-kv")
        run_torpor(node, "restore", str(tmp_path / "ck"), "--netns", netns.path)
        # the same socket, opened before the checkpoint, still answers, with the state
        assert client.ask("GET greeting") == "hello"
        assert client.ask("INCR hits") == "2"
        assert client.ask("SERVED") == "5"
        fresh = LineClient(server, 7000)
        assert fresh.ask("GET greeting") == "hello"
        client.close()
        fresh.close()


def test_a_client_connecting_while_the_workload_is_frozen_does_not_fail_its_checkpoint(
        node: Node, tmp_path: Path, test_image: dict[str, object]) -> None:
    """The kernel accepts connections for a frozen process; CRIU, finding one in a listen
    queue, refuses the whole dump ("In-flight connection"). torpor-runc leaves those out
    ([checkpoint] skip_in_flight): a paused container is checkpointed, left running, with a
    client waiting in its listen queue; resumed, it answers that client, and its checkpoint
    restores with the state."""
    with kvserver_on_veth(node, test_image, "in-flight") as (netns, client, server):
        assert client.ask("SET greeting hello") == "OK"
        client.close()
        node.ctr("tasks", "pause", "in-flight")
        waiting = socket.create_connection((server, 7000), timeout=60)
        waiting.sendall(b"GET greeting\n")       # in the queue: nobody accept()s it
        run_torpor(node, "checkpoint", "in-flight", "-o", str(tmp_path / "ck"),
                   "--leave-running")
        assert task_status(node, "in-flight") == "PAUSED"   # left as it was
        node.ctr("tasks", "resume", "in-flight")
        assert waiting.makefile().readline().strip() == "hello"   # the original answers
        waiting.close()
        node.ctr("tasks", "delete", "--force", "in-flight")
        node.ctr("containers", "delete", "in-flight")
        run_torpor(node, "restore", str(tmp_path / "ck"), "--netns", netns.path)
        fresh = wait_for(lambda: _connect(server, 7000), what="the restored kvserver")
        assert isinstance(fresh, LineClient)
        assert fresh.ask("GET greeting") == "hello"
        fresh.close()


def _connect(host: str, port: int) -> LineClient | None:
    try:
        return LineClient(host, port, timeout=5)
    except OSError:
        return None


@pytest.mark.parametrize("leave_running", [True, False], ids=["leave-running", "stop"])
def test_saved_files_match_the_saved_memory(node: Node, tmp_path: Path,
                                            test_image: dict[str, object],
                                            leave_running: bool) -> None:
    """A shell appends 1, 2, 3, ... to a file in its read-write layer as fast as it can, the
    next number held only in its memory. The restored log goes on without a gap or a repeat:
    the layer was saved at the very moment the memory was (frozen, whether torpor-runc or
    CRIU's pre-dump action froze it)."""
    name = f"append-{'lr' if leave_running else 'stop'}"
    with containers(node) as names:
        names += [name, f"{name}-b"]
        node.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c",
                 "i=0; while true; do i=$((i+1)); echo $i >> /root/log; done")
        wait_for(lambda: len(exec_out(node, name, "cat", "/root/log").split()) > 2000,
                 timeout=30, what="the log to grow")
        flags = ["--leave-running"] if leave_running else []
        run_torpor(node, "checkpoint", name, "-o", str(tmp_path / "ck"), *flags)
        node.ctr("tasks", "delete", "--force", name)
        run_torpor(node, "restore", str(tmp_path / "ck"), "--name", f"{name}-b")
        time.sleep(0.5)
        lines = read_file(node, f"{name}-b", "/root/log").split("\n")
        logged = [int(n) for n in lines[:-2]]  # the last line may be half written
        assert len(logged) > 2000
        assert logged == list(range(1, len(logged) + 1))


def test_files_come_back_under_a_new_name(node: Node, tmp_path: Path,
                                          test_image: dict[str, object]) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "old.txt").write_text("was there before\n")
    script = ("echo rootfs > /root/written; rm /etc/group; mkdir -p /var/new/deep; "
              "echo deep > /var/new/deep/file; echo tmpfs > /scratch/file; "
              "echo shm > /dev/shm/file; echo volume > /data/new.txt; rm /data/old.txt; "
              "exec kvserver 7000")
    with containers(node) as names:
        names += ["files", "files-b"]
        node.ctr("run", "-d", *SHIM, "--mount", f"type=bind,src={volume},dst=/data,options=rbind:rw",
                 "--mount", "type=tmpfs,src=tmpfs,dst=/scratch,options=size=16m",
                 str(test_image["name"]), "files", "sh", "-c", script)
        wait_kv(node, "files")
        run_torpor(node, "checkpoint", "files", "-o", str(tmp_path / "ck"))
        node.ctr("tasks", "delete", "files")
        # a fresh node would have an empty volume: empty this one
        for entry in volume.iterdir():
            entry.unlink()
        run_torpor(node, "restore", str(tmp_path / "ck"), "--name", "files-b",
                   "--volume", f"/data={volume}")
        out = printed(lambda: exec_out(
            node, "files-b", "sh", "-c", "cat /root/written /var/new/deep/file /scratch/file "
            "/dev/shm/file /data/new.txt; ls /etc/group /data/old.txt 2>&1; true"))
        assert out.splitlines()[:5] == ["rootfs", "deep", "tmpfs", "shm", "volume"]
        assert "/etc/group: No such file or directory" in out
        assert "/data/old.txt: No such file or directory" in out
        assert (volume / "new.txt").read_text() == "volume\n"


def test_ctr_checkpoint_carries_torpor_state(node: Node, session_dir: Path,
                                             test_image: dict[str, object]) -> None:
    """`ctr c checkpoint --task` / `ctr c restore --live`: torpor's state rides in criu.tar.
    The volume is where the node's [restore] mount_sources allows: ctr grants nothing."""
    volume = session_dir / "volumes" / "ctr-kv"
    volume.mkdir()
    with containers(node) as names:
        names.append("ctr-kv")
        node.ctr("run", "-d", *SHIM, "--mount", f"type=bind,src={volume},dst=/data,options=rbind:rw",
                 str(test_image["name"]), "ctr-kv", "sh", "-c",
                 "echo kept > /data/v; exec kvserver 7000 127.0.0.1")
        wait_kv(node, "ctr-kv")
        assert kv_ask(node, "ctr-kv", "SET k v1") == "OK"
        node.ctr("containers", "checkpoint", "--task", "ctr-kv", "localhost/ckpt/ctr-kv:1")
        node.ctr("tasks", "delete", "--force", "ctr-kv")
        node.ctr("containers", "delete", "ctr-kv")
        (volume / "v").unlink()
        node.ctr("containers", "restore", "--live", "ctr-kv", "localhost/ckpt/ctr-kv:1")
        wait_for(lambda: task_status(node, "ctr-kv") == "RUNNING", what="restored task")
        # lo is up again (torpor-hook ran at CRIU's setup-namespaces) so the server answers on
        # 127.0.0.1 with the value set before the checkpoint, and the volume file is back
        assert kv_ask(node, "ctr-kv", "GET k") == "v1"
        assert (volume / "v").read_text() == "kept\n"
        # containerd's extracted copy of the checkpoint (memory, in plain files) is gone
        assert not list((node.root / "xdg").glob("ctrd-checkpoint*"))
        node.ctr("images", "rm", "localhost/ckpt/ctr-kv:1")


def test_criu_failure_is_explained_and_the_container_keeps_running(
        node: Node, tmp_path: Path, test_image: dict[str, object]) -> None:
    """An established connection without --tcp-established: CRIU refuses, in its own words."""
    with containers(node) as names:
        names.append("refused")
        node.ctr("run", "-d", *SHIM, str(test_image["name"]), "refused", "sh", "-c",
                 f"kvserver 7000 & sleep 0.3; (while true; do echo PING; sleep 1; done) | "
                 f"nc 127.0.0.1 7000 > /dev/null & {COUNTER}")
        before = wait_counter_above(node, "refused", 10)
        result = run_torpor(node, "checkpoint", "refused", "-o", str(tmp_path / "ck"),
                            check=False)
        assert result.returncode != 0
        assert "Connected TCP socket" in result.stderr or "tcp-established" in result.stderr
        assert not (tmp_path / "ck").exists()
        assert task_status(node, "refused") == "RUNNING"
        assert freezer_state(task_pid(node, "refused")) == "THAWED"
        wait_counter_above(node, "refused", before + 5)


def test_damaged_checkpoints_leave_nothing_behind(node: Node, tmp_path: Path,
                                                  test_image: dict[str, object]) -> None:
    with containers(node) as names:
        names += ["damaged", "damaged-t", "damaged-c"]
        node.ctr("run", "-d", *SHIM, str(test_image["name"]), "damaged", "sh", "-c", COUNTER)
        wait_counter_above(node, "damaged", 5)
        ck = tmp_path / "ck"
        run_torpor(node, "checkpoint", "damaged", "-o", str(ck), "--leave-running")
        pages = next((ck / "criu").glob("pages-*.img"))
        core = next((ck / "criu").glob("core-*.img"))

        truncated = tmp_path / "truncated"
        os.system(f"cp -a {ck} {truncated}")
        with open(truncated / "criu" / pages.name, "r+b") as f:
            f.truncate(pages.stat().st_size // 2)
        result = run_torpor(node, "restore", str(truncated), "--name", "damaged-t", check=False)
        assert result.returncode != 0
        assert "incomplete or damaged" in result.stderr and pages.name in result.stderr

        corrupt = tmp_path / "corrupt"
        os.system(f"cp -a {ck} {corrupt}")
        size = core.stat().st_size
        (corrupt / "criu" / core.name).write_bytes(b"\xff" * size)
        result = run_torpor(node, "restore", str(corrupt), "--name", "damaged-c", check=False)
        assert result.returncode != 0
        # refused before anything is created: torpor reads CRIU's images first (criu_images)
        assert "CRIU images cannot be checked" in result.stderr and core.name in result.stderr

        listed = node.ctr("containers", "ls", "-q").stdout.split()
        assert "damaged-t" not in listed and "damaged-c" not in listed
        assert "damaged-c" not in node.ctr("tasks", "ls").stdout
        snapshots = node.ctr("snapshots", "ls").stdout
        assert "damaged-t" not in snapshots and "damaged-c" not in snapshots
        assert task_status(node, "damaged") == "RUNNING"


def test_killing_torpor_runc_mid_checkpoint_leaves_the_workload_running(
        node: Node, tmp_path: Path, state_dir: Path, test_image: dict[str, object]) -> None:
    hold = state_dir / "test-hold" / "frozen"
    hold.parent.mkdir(parents=True, exist_ok=True)
    with containers(node) as names:
        names.append("killed")
        node.ctr("run", "-d", *SHIM, str(test_image["name"]), "killed", "sh", "-c", COUNTER)
        before = wait_counter_above(node, "killed", 5)
        pid = task_pid(node, "killed")
        hold.touch()
        import subprocess

        cli = subprocess.Popen([str(node.bin_dir / "torpor"), "checkpoint", "killed", "-o",
                                str(tmp_path / "ck")], env=node.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        with reaped(cli):   # a test that failed midway: the CLI killed, and reaped
            try:
                pid_file = Path(str(hold) + ".pid")
                wait_for(pid_file.exists, timeout=30, what="torpor-runc to reach the hold")
                assert freezer_state(pid) == "FROZEN"  # torpor-runc froze it, then we kill it
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
                cli.communicate(timeout=60)
            finally:
                hold.unlink(missing_ok=True)
                Path(str(hold) + ".pid").unlink(missing_ok=True)
        assert cli.returncode != 0
        wait_for(lambda: freezer_state(pid) == "THAWED", timeout=10, what="the guardian's thaw")
        assert task_status(node, "killed") == "RUNNING"
        wait_counter_above(node, "killed", before + 5)
        # and nothing is left to spoil the next checkpoint
        run_torpor(node, "checkpoint", "killed", "-o", str(tmp_path / "ck2"), "--leave-running")
        time.sleep(0)


def test_volume_policy_and_bind_mounted_dev_shm(node: Node, tmp_path: Path,
                                                test_image: dict[str, object]) -> None:
    dirs = {name: tmp_path / name for name in ("data", "scratch", "ref", "shm")}
    for path in dirs.values():
        path.mkdir()
    (dirs["ref"] / "model.bin").write_text("weights\n")
    mounts = []
    for name, dest, mode in (("data", "/data", "rw"), ("scratch", "/scratch", "rw"),
                             ("ref", "/ref", "ro"), ("shm", "/dev/shm", "rw")):
        mounts += ["--mount", f"type=bind,src={dirs[name]},dst={dest},options=rbind:{mode}"]
    with containers(node) as names:
        names += ["vols", "vols-b"]
        node.ctr("run", "-d", *SHIM, *mounts, str(test_image["name"]), "vols", "sh", "-c",
                 "echo d > /data/f; echo s > /scratch/f; echo m > /dev/shm/f; "
                 "exec kvserver 7000")
        wait_kv(node, "vols")
        run_torpor(node, "checkpoint", "vols", "-o", str(tmp_path / "ck"), "--volumes", "/data")
        saved = json.loads((tmp_path / "ck" / "checkpoint.json").read_text())["state"]["files"]
        assert [v["destination"] for v in saved["volumes"]] == ["/data"]
        assert saved["dev_shm"]["destination"] == "/dev/shm"
        node.ctr("tasks", "delete", "vols")
        for name in ("data", "scratch", "shm"):
            for entry in dirs[name].iterdir():
                entry.unlink()
        run_torpor(node, "restore", str(tmp_path / "ck"), "--name", "vols-b",
                   *(f"--volume={dest}" for dest in ("/data", "/scratch", "/ref", "/dev/shm")))
        assert (dirs["data"] / "f").read_text() == "d\n"      # chosen: back
        assert not (dirs["scratch"] / "f").exists()           # not chosen: not touched
        assert (dirs["shm"] / "f").read_text() == "m\n"       # the pod-style /dev/shm: back
        assert (dirs["ref"] / "model.bin").read_text() == "weights\n"


def test_restore_into_a_namespace_lacking_the_socket_addresses(
        node: Node, tmp_path: Path, test_image: dict[str, object]) -> None:
    with subnets.reserved() as (subnet,):
        _restore_into_a_namespace_lacking(node, tmp_path, test_image, subnet.net)


def _restore_into_a_namespace_lacking(node: Node, tmp_path: Path,
                                      test_image: dict[str, object], net: str) -> None:
    first, other = NetNS("torpor-n1"), NetNS("torpor-n2")
    host_if, _ = veth_pair(None, f"{net}.1/24", first, f"{net}.2/24")
    try:
        with containers(node) as names:
            names += ["addr", "addr-b"]
            node.ctr("run", "-d", *SHIM, "--with-ns", f"network:{first.path}",
                     str(test_image["name"]), "addr", "kvserver", "7000")
            client = wait_for(lambda: _connect(f"{net}.2", 7000), what="kvserver on the veth")
            assert isinstance(client, LineClient)
            assert client.ask("SET where first") == "OK"
            run_torpor(node, "checkpoint", "addr", "-o", str(tmp_path / "ck"), "--tcp-established")
            result = run_torpor(node, "restore", str(tmp_path / "ck"), "--name", "addr-b",
                                "--netns", other.path, check=False)
            assert result.returncode != 0
            assert f"lacks the addresses the checkpointed sockets are bound to: {net}.2" \
                in result.stderr
            assert "--add-addresses" in result.stderr
            assert "addr-b" not in node.ctr("containers", "ls", "-q").stdout.split()
            run_torpor(node, "restore", str(tmp_path / "ck"), "--name", "addr-b",
                       "--netns", other.path, "--add-addresses")
            assert kv_ask(node, "addr-b", "GET where") == "first"
            assert f"{net}.2" in other.run("ip", "-o", "addr").stdout
            client.close()
    finally:
        from .support.netns import ip

        ip("link", "delete", host_if, check=False)
        first.delete()
        other.delete()


def test_annotation_gives_ctr_the_flags_it_cannot_pass(node: Node, tmp_path: Path,
                                                       test_image: dict[str, object]) -> None:
    """`ctr c checkpoint` has no --tcp-established; the container's annotation supplies it."""
    held = (f"kvserver 7000 & sleep 0.3; (while true; do echo PING; sleep 1; done) | "
            f"nc 127.0.0.1 7000 > /dev/null & {COUNTER}")
    with containers(node) as names:
        names += ["no-annot", "annot"]
        node.ctr("run", "-d", *SHIM, str(test_image["name"]), "no-annot", "sh", "-c", held)
        node.ctr("run", "-d", *SHIM, "--annotation", "io.torpor.checkpoint.tcp-established=true",
                 str(test_image["name"]), "annot", "sh", "-c", held)
        wait_counter_above(node, "no-annot", 5)
        wait_counter_above(node, "annot", 5)
        refused = node.ctr("containers", "checkpoint", "--task", "no-annot",
                           "localhost/ckpt/no-annot:1", check=False)
        assert refused.returncode != 0 and "Connected TCP socket" in refused.stderr
        before = read_counter(node, "annot")
        node.ctr("containers", "checkpoint", "--task", "annot", "localhost/ckpt/annot:1")
        node.ctr("tasks", "delete", "--force", "annot")
        node.ctr("containers", "delete", "annot")
        node.ctr("containers", "restore", "--live", "annot", "localhost/ckpt/annot:1")
        assert read_counter(node, "annot") >= before
        assert kv_ask(node, "annot", "PING") == "PONG"
        node.ctr("images", "rm", "localhost/ckpt/annot:1")


def test_native_snapshotter_uses_containerds_diff_service(node: Node, tmp_path: Path,
                                                          test_image: dict[str, object]) -> None:
    """Not overlay: the read-write layer comes from containerd's diff service, and back."""
    with containers(node) as names:
        names += ["native", "native-b"]
        node.ctr("run", "-d", "--snapshotter", "native", *SHIM, str(test_image["name"]),
                 "native", "sh", "-c", "echo native > /root/made; rm /etc/group; "
                 "exec kvserver 7000")
        wait_kv(node, "native")
        run_torpor(node, "checkpoint", "native", "-o", str(tmp_path / "ck"))
        assert (tmp_path / "ck" / "rootfs-diff.tar").stat().st_size > 0
        node.ctr("tasks", "delete", "native")
        run_torpor(node, "restore", str(tmp_path / "ck"), "--name", "native-b")
        out = printed(lambda: exec_out(node, "native-b", "sh", "-c",
                                       "cat /root/made; ls /etc/group 2>&1; true"))
        assert "native" in out and "No such file" in out
