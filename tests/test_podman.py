"""Podman (Debian 12's 4.3.1) with `--runtime` torpor-runc: its own checkpoint and restore on the
node that checkpointed, `--export`/`--import` included, keep the container's state; an archive
whose spec was tampered with, or one from another node, meets the node's restore policy like
any foreign checkpoint.

Every Podman here has its own storage, run root and torpor config (tests/support/podman.py): a
second one is a second node, with its own node key. Network: none (loopback only).
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from torpor.formats import state as container_state

from .support.netns import NetNS
from .support.podman import Podman
from .support.processes import free_port
from .support.torpord import Host, Torpord
from .support.workload import COUNTER

pytestmark = pytest.mark.real

MakePodman = Callable[..., Podman]


@pytest.fixture
def podman(torpor_bin: Path, test_image: dict[str, object]) -> Iterator[MakePodman]:
    made: list[Podman] = []

    def make(name: str = "a", policy: str = "", runtime: Path | None = None,
             netns: str | None = None) -> Podman:
        instance = Podman(name, torpor_bin, Path(str(test_image["tar"])), policy, runtime, netns)
        made.append(instance)
        return instance

    try:
        yield make
    finally:
        for instance in made:
            instance.close()


def userdata(pm: Podman, name: str) -> Path:
    container_id = pm("inspect", "-f", "{{.Id}}", name).stdout.strip()
    return pm.root / "root" / "overlay-containers" / container_id / "userdata"


def edit_spec(archive: Path, edit: Callable[[dict[str, object]], None]) -> None:
    """Rewrite the spec (spec.dump) inside a Podman checkpoint archive (uncompressed tar)."""
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            f = tar.extractfile(member) if member.isfile() else None
            members.append((member, f.read() if f else None))
    with tarfile.open(archive, "w") as tar:
        for member, data in members:
            if member.name == "spec.dump":
                spec = json.loads(data or b"{}")
                edit(spec)
                data = json.dumps(spec).encode()
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data is not None else None)


def test_checkpoint_and_restore_on_this_node_keep_the_state(podman: MakePodman) -> None:
    pm = podman()
    pm.run("web", f"echo kept > /root/f; {COUNTER}")
    before = pm.wait_counter_above("web", 10)

    pm("container", "checkpoint", "web")
    assert pm.state("web") == "exited"
    state = container_state.read(str(userdata(pm, "web") / "checkpoint"))
    assert state is not None and state.spec_seal  # torpor-runc checkpointed and sealed it

    pm("container", "restore", "web")
    assert pm.state("web") == "running"
    resumed = pm.counter("web")
    assert resumed >= before  # from where it was, not from zero
    pm.wait_counter_above("web", resumed + 3)
    assert pm("exec", "web", "cat", "/root/f").stdout == "kept\n"


def test_checkpoint_and_restore_through_torpord(podman: MakePodman, torpor_bin: Path,
                                                tmp_path: Path) -> None:
    """With torpord on the node, torpor-runc hands Podman's checkpoint and its restore to it
    (the metrics count both); the restore's runc runs below conmon, which sees the restored
    container end when Podman stops it; the state is kept."""
    pm = podman()
    sock, port = pm.root / "torpord.sock", free_port()
    pm.set_policy(f'[service]\nsocket = "{sock}"\nmetrics = "127.0.0.1:{port}"\n')
    torpord = Torpord(Host(torpor_bin, {"PATH": os.environ["PATH"],
                                        "TORPOR_CONFIG": str(pm.config)}),
                      sock, port, tmp_path / "torpord.log").start()
    try:
        pm.run("web", f"echo kept > /root/f; {COUNTER}")
        before = pm.wait_counter_above("web", 10)
        pm("container", "checkpoint", "web")
        pm("container", "restore", "web")
        assert pm.state("web") == "running"
        resumed = pm.counter("web")
        assert resumed >= before
        pm.wait_counter_above("web", resumed + 3)
        assert pm("exec", "web", "cat", "/root/f").stdout == "kept\n"
        assert torpord.count("torpor-runc checkpoint") == 1, torpord.metrics_text()
        assert torpord.count("torpor-runc restore") == 1, torpord.metrics_text()
        pm("stop", "-t", "1", "web")   # conmon, the restored init's reaper, sees it end
        assert pm.state("web") == "exited"
    finally:
        torpord.stop()


def test_restore_into_podmans_new_network_namespace(podman: MakePodman) -> None:
    """On Podman's default network (its bridge, in a namespace of the test's), a restore gets a
    network namespace Podman made for it, not the one checkpointed: the node's own, not the
    checkpoint's request. The server listens again there."""
    netns = NetNS("torpor-pm")
    pm = podman(netns=netns.path)
    try:
        pm.run("web", f"kvserver 7000 & {COUNTER}")
        before = pm.wait_counter_above("web", 10)
        pm("container", "checkpoint", "web")
        pm("container", "restore", "web")
        assert pm.counter("web") >= before
        address = pm("inspect", "-f", "{{.NetworkSettings.IPAddress}}", "web").stdout.strip()
        assert netns.run("busybox", "sh", "-c", f"echo PING | busybox nc -w5 {address} 7000"
                         ).stdout == "PONG\n"
    finally:
        pm.close()  # while its namespace is there
        netns.delete()


def test_export_and_import_on_this_node(podman: MakePodman, tmp_path: Path) -> None:
    pm = podman()
    pm.run("web", f"echo kept > /root/f; {COUNTER}")
    before = pm.wait_counter_above("web", 10)
    archive = tmp_path / "web.tar"
    pm("container", "checkpoint", "--export", str(archive), "--compress", "none", "web")
    pm("rm", "web")

    pm("container", "restore", "--import", str(archive))  # the same id, a new root
    resumed = pm.counter("web")
    assert resumed >= before
    pm.wait_counter_above("web", resumed + 3)
    assert pm("exec", "web", "cat", "/root/f").stdout == "kept\n"

    pm("container", "restore", "--import", str(archive), "--name", "copy")  # a new id too
    assert pm.counter("copy") >= before
    pm.wait_counter_above("copy", before + 3)
    assert pm("exec", "copy", "cat", "/root/f").stdout == "kept\n"


def add_host_mount(canary: Path) -> Callable[[dict[str, object]], None]:
    def edit(spec: dict[str, object]) -> None:
        mounts = spec.setdefault("mounts", [])
        assert isinstance(mounts, list)
        mounts.append({"destination": "/canary", "type": "bind", "source": str(canary),
                       "options": ["rbind", "rw"]})
    return edit


def add_hook(canary: Path) -> Callable[[dict[str, object]], None]:
    def edit(spec: dict[str, object]) -> None:
        spec["hooks"] = {"prestart": [{"path": "/bin/sh", "args": [
            "torpor-hook", "-c", f"echo ran > {canary}/hook-ran"]}]}
    return edit


@pytest.mark.parametrize("tamper", ["host-mount", "hook"])
def test_an_import_whose_spec_was_tampered_with_is_refused(
        podman: MakePodman, tmp_path: Path, tamper: str) -> None:
    pm = podman()
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret").write_text("host\n")
    pm.run("web", COUNTER)
    before = pm.wait_counter_above("web", 5)
    archive, genuine = tmp_path / "web.tar", tmp_path / "genuine.tar"
    pm("container", "checkpoint", "--export", str(archive), "--compress", "none", "web")
    genuine.write_bytes(archive.read_bytes())
    edit_spec(archive, (add_host_mount if tamper == "host-mount" else add_hook)(canary))
    pm("rm", "web")

    refused = pm("container", "restore", "--import", str(archive), check=False)
    assert refused.returncode != 0
    assert "restore policy" in refused.stderr and "does not allow" in refused.stderr
    assert (f"bind mount of host path {str(canary)!r} at /canary" if tamper == "host-mount"
            else "prestart hook /bin/sh") in refused.stderr
    assert "root filesystem" not in refused.stderr  # Podman's own root is not the checkpoint's
    assert sorted(p.name for p in canary.iterdir()) == ["secret"]  # no hook ran
    assert (canary / "secret").read_text() == "host\n"
    assert pm.state("web") != "running"  # nothing runs; Podman keeps its record until rm
    records = pm.state_dir / "containers"
    assert not records.exists() or not any(records.iterdir())  # torpor left nothing
    pm("rm", "web")

    pm("container", "restore", "--import", str(genuine))  # the archive as this node made it
    assert pm.counter("web") >= before


def test_an_archive_from_another_node_meets_the_policy(podman: MakePodman,
                                                       tmp_path: Path) -> None:
    """Node B's archive asks node A for a host directory: refused in the policy's words, then
    restored once A's policy allows what it asks for."""
    volume = tmp_path / "volume"
    volume.mkdir()
    launcher = tmp_path / "bin" / "torpor-runc"  # one path, as /usr/local/bin/torpor-runc
    a, b = podman("a", runtime=launcher), podman("b", runtime=launcher)
    b.run("web", f"echo kept > /data/f; {COUNTER}", "-v", f"{volume}:/data")
    before = b.wait_counter_above("web", 10)
    archive = tmp_path / "web.tar"
    b("container", "checkpoint", "--export", str(archive), "--compress", "none", "web")

    refused = a("container", "restore", "--import", str(archive), check=False)
    assert refused.returncode != 0
    assert "does not allow" in refused.stderr
    assert f"bind mount of host path {str(volume)!r} at /data" in refused.stderr
    assert "root filesystem" not in refused.stderr and "/etc/hosts" not in refused.stderr
    assert a.state("web") != "running"
    a("rm", "web")

    # and any annotation it carries that the node acts on (none of Podman's own are)
    allowed = sorted(set(re.findall(r'\[restore\] annotations = \[\\*"([^"\\]+)',
                                    refused.stderr)))
    a.set_policy(f'[restore]\nmount_sources = ["{volume}"]\n'
                 f'annotations = {json.dumps(allowed)}\n')
    a("container", "restore", "--import", str(archive))
    resumed = a.counter("web")
    assert resumed >= before
    a.wait_counter_above("web", resumed + 3)
    assert a("exec", "web", "cat", "/data/f").stdout == "kept\n"
