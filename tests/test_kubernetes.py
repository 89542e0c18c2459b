"""Kubernetes' checkpoint API through containerd 2.x's CRI, with the real crictl (what kubelet
sends: RunPodSandbox, CreateContainer, StartContainer, CheckpointContainer, and CreateContainer
with a checkpoint as the image), a CNI bridge and a sandbox image from a local registry.

Every flow runs with plain runc first, as a baseline in the same test: when the baseline fails,
containerd or the machine broke, not torpor. Then the same with the `torpor` runtime class, plus
what only torpor carries: an emptyDir-like volume, the pod's /dev/shm, open connections (closed
in the copy, whose pod has a new IP), and the refusal of a pod of another runtime class.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pytest
import zstandard

from .conftest import run_torpor
from .support import cri, ecosystem, subnets
from .support.netns import NetNS
from .support.processes import free_port, kill_pid, wait_for
from .support.registry import Registry
from .support.workload import COUNTER, LineClient, read_counter, read_file, remove
from .support.world import World

pytestmark = pytest.mark.real

WORKLOAD = ["sh", "-c", "echo kept > /data/note; echo in-shm > /dev/shm/note; kvserver 7000 & "
            + COUNTER]


@dataclass
class Cluster:
    a: cri.CriNode
    b: cri.CriNode
    registry: Registry
    refs: dict[str, str]
    work: Path

    def crictl(self, node: cri.CriNode) -> cri.Crictl:
        return cri.Crictl(node)


@pytest.fixture(scope="module")
def cluster(world: World) -> Iterator[Cluster]:
    base = world.base / "kubernetes"
    base.mkdir()
    registry = Registry(base, "registry").start()
    nodes: list[cri.CriNode] = []
    held: list[subnets.Subnet] = []   # the nodes' pod bridges are the host's
    try:
        refs = cri.publish_images(base, registry, world.image_layout)
        for name in ("ka", "kb"):
            held.append(subnets.reserve())
            cri.start_node(base, name, world.bin, world.config, refs, held[-1].octet,
                           started=nodes)
        work = base / "work"
        work.mkdir()
        yield Cluster(nodes[0], nodes[1], registry, refs, work)
    finally:
        for node in reversed(nodes):
            node.stop()
        for subnet in held:
            subnet.release()
        registry.stop()


@dataclass
class Running:
    """A pod and its counter container."""

    node: cri.CriNode
    pod: str
    container: str
    ip: str
    data: Path


def run_counter(cluster: Cluster, node: cri.CriNode, name: str, handler: str,
                image: str | None = None) -> Running:
    """A pod with the counter workload (or a restore of `image`), its /data on a fresh host
    directory where kubelet puts an emptyDir (torpor restores a saved volume into a pod's
    emptyDir, never into a hostPath the pod's author chose)."""
    crictl = cluster.crictl(node)
    data = cluster.work / "pods" / name / "volumes" / "kubernetes.io~empty-dir" / "data"
    data.mkdir(parents=True)
    pod = crictl.run_pod(cluster.work, name, handler)
    container = crictl.create(pod, cluster.work, name, image or cluster.refs["workload"],
                              None if image else WORKLOAD, {"/data": data})
    crictl("start", container)
    return Running(node, pod, container, crictl.pod_ip(pod), data)


def remove_pod(cluster: Cluster, running: Running) -> None:
    crictl = cluster.crictl(running.node)
    crictl("stopp", running.pod, check=False)
    crictl("rmp", "-f", running.pod, check=False)


def assert_counter_continues(cluster: Cluster, restored: Running, checkpointed_at: int) -> int:
    crictl = cluster.crictl(restored.node)
    first = crictl.read_counter(restored.container)
    assert first >= checkpointed_at, f"the counter restarted: {first} < {checkpointed_at}"
    return crictl.wait_counter_above(restored.container, first)


def assert_torpor_files_back(cluster: Cluster, restored: Running) -> None:
    crictl = cluster.crictl(restored.node)
    assert (restored.data / "note").read_text() == "kept\n"  # on the new pod's own directory
    assert crictl.exec(restored.container, "cat", "/dev/shm/note") == "in-shm"


def test_kubelet_checkpoint_restores_in_new_pods_on_one_node_and_across_two(
        cluster: Cluster, torpor_bin: Path) -> None:
    archives: dict[str, Path] = {}
    for handler in ("runc", "torpor"):
        stage = "baseline (plain runc: containerd or this machine, not torpor)" \
            if handler == "runc" else "torpor"
        a, b = cluster.crictl(cluster.a), cluster.crictl(cluster.b)
        original = run_counter(cluster, cluster.a, f"count-{handler}", handler)
        before = a.wait_counter_above(original.container, 5)
        client = None
        if handler == "torpor":  # plain runc cannot checkpoint a connected server under CRI
            client = LineClient(original.ip, 7000)
            assert client.ask("SET k v1") == "OK"
        # what kubelet's /checkpoint endpoint calls: CheckpointContainer
        archive = cluster.work / f"{handler}.tar"
        result = a.run("checkpoint", f"--export={archive}", original.container, check=False)
        assert result.returncode == 0, f"{stage}: checkpoint failed: {result.stderr}"
        archives[handler] = archive
        assert a.state(original.container) == "CONTAINER_RUNNING"
        a.wait_counter_above(original.container, before)

        # restore 1: the archive's path as the image, in a new pod on the same node
        same = run_counter(cluster, cluster.a, f"same-{handler}", handler, str(archive))
        assert_counter_continues(cluster, same, before)
        if handler == "runc":
            assert not (same.data / "note").exists()  # plain runc carries no volumes
        else:
            assert_torpor_files_back(cluster, same)
            assert client is not None
            assert same.ip != original.ip
            # the copy's connection was restored closed; the original keeps serving its client
            established = a.exec(same.container, "netstat", "-tn")
            assert "ESTABLISHED" not in established, established
            assert client.ask("GET k") == "v1"
            fresh = LineClient(same.ip, 7000)
            assert fresh.ask("GET k") == "v1"   # the state, at the pod's new address
            fresh.close()
            client.close()

        # restore 2: a checkpoint OCI image, pushed to a registry and pulled through CRI, on
        # the other node; then each path where the other one ran
        ref = f"{cluster.registry.host}/checkpoints/count-{handler}:1"
        run_torpor(cluster.a, "kube", "image", str(archive), "-t", ref, "--insecure")
        b("pull", ref)
        moved = run_counter(cluster, cluster.b, f"moved-{handler}", handler, ref)
        assert_counter_continues(cluster, moved, before)
        a("pull", ref)
        image_here = run_counter(cluster, cluster.a, f"image-here-{handler}", handler, ref)
        archive_there = run_counter(cluster, cluster.b, f"archive-there-{handler}", handler,
                                    str(archive))
        for restored in (image_here, archive_there):
            assert_counter_continues(cluster, restored, before)
        if handler == "torpor":
            for restored in (moved, image_here, archive_there):
                assert_torpor_files_back(cluster, restored)
            assert moved.ip.rsplit(".", 2)[0] != original.ip.rsplit(".", 2)[0]  # node b's net
        for running in (original, same, moved, image_here, archive_there):
            remove_pod(cluster, running)

    # a torpor checkpoint in a pod of another runtime class: refused before anything runs
    crictl = cluster.crictl(cluster.a)
    pod = crictl.run_pod(cluster.work, "wrong-class", "runc")
    container = crictl.create(pod, cluster.work, "wrong-class", str(archives["torpor"]), None,
                              {"/data": cluster.work})
    refused = crictl.run("start", container, check=False)
    assert refused.returncode != 0
    assert "descriptors.json: no such file or directory" in refused.stderr, refused.stderr
    assert crictl.state(container) != "CONTAINER_RUNNING"
    crictl("rmp", "-f", pod)

    # a torpor checkpoint restored into a pod that mounts a host path of its author's choosing
    # where the checkpoint saved a volume: refused in words, the host path left as it was
    host_path = cluster.work / "a-host-path"
    host_path.mkdir()
    pod = crictl.run_pod(cluster.work, "host-path", "torpor")
    container = crictl.create(pod, cluster.work, "host-path", str(archives["torpor"]), None,
                              {"/data": host_path})
    refused = crictl.run("start", container, check=False)
    assert refused.returncode != 0
    assert "which neither kubelet made for the pod" in refused.stderr, refused.stderr
    assert list(host_path.iterdir()) == []
    crictl("rmp", "-f", pod)

    # what checkpointctl (issue 16) and `torpor inspect` make of kubelet's archive from torpor
    check_with_checkpointctl(archives["torpor"], "count-torpor", cluster.refs["workload"],
                             stats=True)
    report = json.loads(run_torpor(cluster.a, "inspect", "--json",
                                   str(archives["torpor"])).stdout)
    assert report["kind"] == "kubelet-archive"
    assert report["kubernetes"]["container"] == "count-torpor"
    assert report["kubernetes"]["torpor_state"] is True
    assert report["image"] == cluster.refs["workload"]
    assert {v["destination"] for v in report["files"]["volumes"]} == {"/data"}
    plain = json.loads(run_torpor(cluster.a, "inspect", "--json", str(archives["runc"])).stdout)
    assert plain["kubernetes"]["torpor_state"] is False


def test_kubelet_checkpoint_restored_by_torpor_restore(cluster: Cluster) -> None:
    crictl = cluster.crictl(cluster.a)
    original = run_counter(cluster, cluster.a, "for-torpor", "torpor")
    before = crictl.wait_counter_above(original.container, 5)
    archive = cluster.work / "for-torpor.tar"
    crictl("checkpoint", f"--export={archive}", original.container)
    remove_pod(cluster, original)

    # outside any pod: node b's own namespace, the base image pulled there as for any restore;
    # the pod's container joined the pod's network namespace, so it is given one to join
    node = cluster.b
    node.ctr("images", "pull", "--plain-http", cluster.refs["workload"])
    data = cluster.work / "torpor-restored-data"
    data.mkdir()
    refused = run_torpor(node, "restore", str(archive), "--name", "from-kubelet", check=False)
    assert refused.returncode != 0 and "--netns" in refused.stderr, refused.stderr
    netns = NetNS("torpor-kube")
    try:
        run_torpor(node, "restore", str(archive), "--name", "from-kubelet", "--netns",
                   netns.path, "--volume", f"/data={data}")
        value = read_counter(node, "from-kubelet")
        assert value >= before
        assert (data / "note").read_text() == "kept\n"
        assert read_file(node, "from-kubelet", "/dev/shm/note").strip() == "in-shm"
        wait_for(lambda: read_counter(node, "from-kubelet") > value,
                 what="the restored counter to move")
    finally:
        remove(node, "from-kubelet")
        netns.delete()

    # and as a torpor checkpoint directory, made on the node that holds the base image
    imported = cluster.work / "imported"
    run_torpor(cluster.a, "--namespace", "k8s.io", "kube", "import", str(archive), "-o",
               str(imported))
    metadata = json.loads((imported / "checkpoint.json").read_text())
    assert metadata["container"]["id"] == json.loads(
        subprocess.run(["tar", "-xOf", str(archive), "config.dump"], capture_output=True,
                       check=True).stdout)["id"]
    assert (imported / "criu" / "descriptors.json").exists()
    assert (imported / "rootfs-diff.tar").exists()


def test_torpor_checkpoint_restored_by_a_pod(cluster: Cluster) -> None:
    crictl = cluster.crictl(cluster.a)
    original = run_counter(cluster, cluster.a, "by-torpor", "torpor")
    before = crictl.wait_counter_above(original.container, 5)
    # torpor's own checkpoint image of the pod's container, pushed
    ref = f"{cluster.registry.host}/checkpoints/by-torpor:1"
    run_torpor(cluster.a, "--namespace", "k8s.io", "checkpoint", original.container, "-t", ref,
               "--push", "--leave-running", "--insecure")
    remove_pod(cluster, original)

    # as a kubelet archive and as the image a pod restores, both made by torpor
    archive = cluster.work / "by-torpor.tar"
    run_torpor(cluster.a, "kube", "archive", ref, "-o", str(archive), "--insecure")
    cri_ref = f"{cluster.registry.host}/checkpoints/by-torpor-cri:1"
    layout = cluster.work / "by-torpor-cri"
    run_torpor(cluster.a, "kube", "image", ref, "-t", cri_ref, "-o", str(layout), "--insecure")
    check_with_checkpointctl(archive, "by-torpor", cluster.refs["workload"], stats=False)
    manifest = json.loads(subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{cri_ref}"],
        capture_output=True, check=True, text=True).stdout)
    assert manifest["annotations"]["org.criu.checkpoint.container.name"] == "by-torpor"
    layer = layout / "blobs" / "sha256" / manifest["layers"][0]["digest"].split(":")[1]
    check_with_checkpointctl(layer, "by-torpor", cluster.refs["workload"], stats=False)

    # restored by pods on node b: from the archive's path, and from the image
    b = cluster.crictl(cluster.b)
    from_archive = run_counter(cluster, cluster.b, "by-torpor-archive", "torpor", str(archive))
    assert_counter_continues(cluster, from_archive, before)
    assert_torpor_files_back(cluster, from_archive)
    b("pull", cri_ref)
    from_image = run_counter(cluster, cluster.b, "by-torpor-image", "torpor", cri_ref)
    assert_counter_continues(cluster, from_image, before)
    assert_torpor_files_back(cluster, from_image)
    for running in (from_archive, from_image):
        remove_pod(cluster, running)


def check_with_checkpointctl(archive: Path, container: str, image: str, stats: bool) -> None:
    """checkpointctl show and inspect read the archive without errors and report the right
    container, image and sizes (what the archive's own entries add up to)."""
    tool = str(ecosystem.tool("checkpointctl"))
    shown = subprocess.run([tool, "show", str(archive)], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert container in shown.stdout and image in shown.stdout, shown.stdout
    flags = ["--ps-tree", "--mounts", "--files", "--sockets", "--metadata"]
    inspected = subprocess.run([tool, "inspect", *flags, *(["--stats"] if stats else []),
                                "--format", "json", str(archive)],
                               capture_output=True, text=True, timeout=60)
    assert inspected.returncode == 0, inspected.stderr
    node = json.loads(inspected.stdout)[0]
    assert node["container_name"] == container
    assert node["image"] == image
    sizes = entry_sizes(archive)
    checkpoint = sum(size for name, size in sizes.items() if name.startswith("checkpoint/"))
    assert node["checkpoint_size"]["total_size"] == checkpoint
    assert node["checkpoint_size"]["root_fs_diff_size"] == sizes.get("rootfs-diff.tar", 0)
    assert node["checkpoint_size"]["memory_pages_size"] == sum(
        size for name, size in sizes.items() if name.startswith("checkpoint/pages-"))
    assert node["process_tree"]["command"] == "sh"


def entry_sizes(archive: Path) -> dict[str, int]:
    """name -> size of every file in a tar, or in a zstd-compressed one (an image's layer)."""
    with open(archive, "rb") as f:
        compressed = f.read(4) == b"\x28\xb5\x2f\xfd"
        f.seek(0)
        stream: BinaryIO = zstandard.ZstdDecompressor().stream_reader(f) if compressed else f
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            return {m.name.removeprefix("./"): m.size for m in tar if m.isfile()}


INSTALLER = Path(__file__).resolve().parents[1] / "packaging" / "kubernetes" / "node-install.sh"


def installer_env(tmp_path: Path, torpor_bin: Path, version: str = "2.1.9",
                  torpord: str = "none") -> dict[str, str]:
    """node-install.sh past the installation of torpor, on temporary paths: containerd's config
    under tmp_path/etc, the real containerd 2.1.9 saying it is `version`, no restart."""
    real = ecosystem.CONTAINERD2_BIN / "containerd"
    containerd = tmp_path / "containerd"
    containerd.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = --version ] && {{ echo "containerd x/v2 v{version} abc"; exit 0; }}\n'
        f'exec {real} "$@"\n')
    containerd.chmod(0o755)
    return {"PATH": f"{ecosystem.CONTAINERD2_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
            "CONTAINERD_CONFIG": str(tmp_path / "etc" / "config.toml"),
            "CONTAINERD_BIN": str(containerd),
            "TORPOR_BIN": str(torpor_bin / "torpor"), "PREFIX": str(torpor_bin.parent),
            "TORPOR_SKIP_INSTALL": "1", "TORPOR_RESTART": "none",
            "TORPOR_MARKER": str(tmp_path / "installed"), "TORPOR_PYTHON": sys.executable,
            "TORPOR_CONFIG": str(tmp_path / "torpor" / "config.toml"), "TORPORD": torpord,
            "TORPORD_STATE": str(tmp_path / "torpord.installed")}


def install(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", str(INSTALLER)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.parametrize("version", ["2.1.9", "2.2.7"])
def test_node_installer_merges_the_runtime_class_once(tmp_path: Path, torpor_bin: Path,
                                                      version: str) -> None:
    """packaging/kubernetes/node-install.sh past the installation of torpor: the runtime class
    merged into containerd's defaults, restore through CreateContainer switched on where
    containerd wants it (2.2.7), nothing changed on a second run. containerd says which version
    it is; the real 2.1.9 checks that the result loads."""
    real = ecosystem.CONTAINERD2_BIN / "containerd"
    env = installer_env(tmp_path, torpor_bin, version)
    config = Path(env["CONTAINERD_CONFIG"])
    first = subprocess.run(["bash", str(INSTALLER)], env=env, capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == 0, first.stderr
    assert "restart containerd to load it" in first.stderr
    dumped = tomllib.loads(subprocess.run([str(real), "--config", str(config), "config", "dump"],
                                          capture_output=True, text=True, check=True).stdout)
    runtime = dumped["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["containerd"]["runtimes"]["torpor"]["options"]["BinaryName"] == \
        str(torpor_bin / "torpor-runc")
    assert "runc" in runtime["containerd"]["runtimes"]
    wanted = version == "2.2.7"
    assert ("enable_experimental_restore_via_create = true" in config.read_text()) is wanted
    assert (tmp_path / "installed").read_text().startswith("torpor ")
    # a Kubernetes node restores only signed checkpoints (or its own) unless told otherwise
    written = tomllib.loads((tmp_path / "torpor" / "config.toml").read_text())
    assert written["restore"]["signatures"] == "required"
    from torpor.config import Config

    assert Config(written).restore_signatures == "required"
    text = config.read_text()
    again = subprocess.run(["bash", str(INSTALLER)], env=env, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    assert "already has the torpor runtime class" in again.stderr
    assert config.read_text() == text


def test_node_installer_names_torpor_decoder_with_the_nodes_keys(tmp_path: Path,
                                                                   torpor_bin: Path) -> None:
    """TORPOR_DECRYPTION_KEYS: containerd 2.1.9 (the real one, `config dump`) loads torpor-decoder
    as the stream processor of encrypted layers (in place of the ctd-decoder its defaults name
    and this node lacks), its CRI plugin pulls itself (the transfer service hands no keys to a
    processor), and torpor's new config opens encrypted checkpoints with the same keys."""
    real = ecosystem.CONTAINERD2_BIN / "containerd"
    env = {**installer_env(tmp_path, torpor_bin), "TORPOR_DECRYPTION_KEYS": str(tmp_path / "keys")}
    install(env)
    config = Path(env["CONTAINERD_CONFIG"])
    dumped = tomllib.loads(subprocess.run([str(real), "--config", str(config), "config", "dump"],
                                          capture_output=True, text=True, check=True).stdout)
    for table in ("tar", "tar.gzip"):
        processor = dumped["stream_processors"][f"io.containerd.ocicrypt.decoder.v1.{table}"]
        assert processor["path"] == str(torpor_bin / "torpor-decoder")
        assert processor["args"][:2] == ["--decryption-keys-path", str(tmp_path / "keys")]
    assert dumped["plugins"]["io.containerd.cri.v1.images"]["use_local_image_pull"] is True
    written = tomllib.loads((tmp_path / "torpor" / "config.toml").read_text())
    assert written["restore"]["decryption_keys"] == [str(tmp_path / "keys")]
    text = config.read_text()
    again = install(env)
    assert "already has the torpor runtime class and torpor-decoder" in again.stderr
    assert config.read_text() == text


def service_config(tmp_path: Path) -> tuple[Path, int]:
    """torpor's config for an installer run that starts torpord: its socket, state, store and
    metrics port on temporary paths; its port."""
    port = free_port()
    config = tmp_path / "torpor" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[runtime]\nstate_dir = "{tmp_path}/state"\nlog_dir = "{tmp_path}/logs"\n'
                      f'[image]\nstore = "{tmp_path}/store"\n[restore]\nsignatures = "required"\n'
                      f'[service]\nsocket = "{tmp_path}/torpord.sock"\n'
                      f'metrics = "127.0.0.1:{port}"\n')
    return config, port


def commands_served(port: int, command: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    wanted = f'torpor_commands_total{{command="{command}",result="success"}} '
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted))


def installed_pid(env: dict[str, str]) -> int:
    return int(Path(env["TORPORD_STATE"]).read_text().split()[0])


def test_node_installer_starts_torpord_once_and_again_for_a_new_torpor(
        tmp_path: Path, torpor_bin: Path) -> None:
    """A host whose init is not systemd (this one): the installer starts torpord itself,
    detached; the CLI then hands its commands to it (the metrics count them); a second run
    leaves it as it is; a run for another torpor version replaces it, SIGTERM first."""
    config, port = service_config(tmp_path)
    env = {**installer_env(tmp_path, torpor_bin, torpord="direct"), "TORPORD_CGROUP": "",
           "TORPORD_LOG": str(tmp_path / "torpord.log")}
    pids: list[int] = []
    try:
        first = install(env)
        pids.append(installed_pid(env))
        assert f"torpord: started (pid {pids[0]}" in first.stderr, first.stderr
        cli = {"PATH": env["PATH"], "TORPOR_CONFIG": str(config)}
        listed = subprocess.run([str(torpor_bin / "torpor"), "ls"], env=cli,
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        # through the installed torpord (which counts it once it has reaped its child)
        wait_for(lambda: commands_served(port, "ls") == 1, timeout=30,
                 what="torpord to count the ls")

        again = install(env)
        assert "torpord: already answers on its socket" in again.stderr, again.stderr
        assert installed_pid(env) == pids[0] and Path(f"/proc/{pids[0]}").exists()

        Path(env["TORPORD_STATE"]).write_text(f"{pids[0]} 0.0.1\n")   # started by an older one
        upgraded = install(env)
        pids.append(installed_pid(env))
        assert f"stopping pid {pids[0]} (torpor 0.0.1" in upgraded.stderr, upgraded.stderr
        wait_for(lambda: not Path(f"/proc/{pids[0]}").exists()
                 or "Z" in Path(f"/proc/{pids[0]}/stat").read_text().split()[2],
                 timeout=30, what="the old torpord gone")
        assert pids[1] != pids[0] and commands_served(port, "ls") == 0   # a new service
    finally:
        for pid in pids:
            kill_pid(pid)


def test_node_installer_installs_the_systemd_unit_once(tmp_path: Path, torpor_bin: Path) -> None:
    """A systemd host, as far as one goes without systemd as pid 1: the unit written with
    ExecStart in the install's prefix (systemd-analyze verify accepts it: the command exists),
    enabled and started once; a second run changes nothing and restarts nothing. systemctl is
    a script that records its calls and runs the unit's ExecStart on start/restart."""
    config, _ = service_config(tmp_path)
    calls, units = tmp_path / "systemctl.calls", tmp_path / "units"
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >>{calls}\n'
        'case "$1" in\n'
        f'  is-enabled) [ -e {tmp_path}/enabled ] ;;\n'
        f'  enable) touch {tmp_path}/enabled ;;\n'
        f'  is-active) [ -e {tmp_path}/active ] && kill -0 "$(cat {tmp_path}/active)" ;;\n'
        f'  start|restart) exec=$(sed -n "s/^ExecStart=//p" {units}/torpord.service)\n'
        f'    setsid "$exec" </dev/null >>{tmp_path}/torpord.log 2>&1 &\n'
        f'    echo $! >{tmp_path}/active ;;\n'
        'esac\n')
    systemctl.chmod(0o755)
    env = {**installer_env(tmp_path, torpor_bin, torpord="systemd"),
           "SYSTEMCTL": str(systemctl), "SYSTEMD_UNIT_DIR": str(units)}
    try:
        first = install(env)
        unit = (units / "torpord.service").read_text()
        assert f"ExecStart={torpor_bin / 'torpord'}\n" in unit and "KillMode=process" in unit
        verified = subprocess.run(["systemd-analyze", "verify", str(units / "torpord.service")],
                                  capture_output=True, text=True, timeout=60)
        assert verified.returncode == 0, verified.stderr
        assert calls.read_text().splitlines() == [
            "daemon-reload", "is-enabled --quiet torpord", "enable torpord", "restart torpord"]
        assert "torpord: (re)started with systemd" in first.stderr
        assert "does not answer" not in first.stderr, first.stderr
        ping = subprocess.run([str(torpor_bin / "torpord"), "--ping"],
                              env={"TORPOR_CONFIG": str(config)}, timeout=60)
        assert ping.returncode == 0
        calls.write_text("")
        again = install(env)
        assert calls.read_text().splitlines() == ["is-enabled --quiet torpord",
                                                  "is-active --quiet torpord"]
        assert "torpord: already running (systemd)" in again.stderr
        assert (units / "torpord.service").read_text() == unit
    finally:
        if (tmp_path / "active").exists():
            kill_pid(int((tmp_path / "active").read_text()))
