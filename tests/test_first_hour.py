"""A new user's first hour (issue 24): every refusal that can be known before the expensive part
comes before it, and says what to do. Real containerd, runc, CRIU and docker-registry; the
registry's own log counts what was asked of it."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Nodes, run_torpor
from .support.containerd import Node
from .support.processes import free_port
from .support.registry import Registry, docker_config
from .support.workload import (
    COUNTER,
    containers,
    read_counter,
    read_file,
    task_pid,
    task_status,
    wait_counter_above,
)

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]


@pytest.fixture(scope="module")
def first_node(nodes: Nodes, session_dir: Path) -> Node:
    """A node with a store and state of its own (so a test can look at what it left)."""
    base = session_dir / "first-hour"
    base.mkdir()
    config = base / "node.toml"
    config.write_text(f'[runtime]\nstate_dir = "{base}/state"\n'
                      f'log_dir = "{base}/state-logs"\n[image]\nstore = "{base}/store"\n')
    return nodes.start("first-hour", config=config)


@pytest.fixture(scope="module")
def registry(session_dir: Path) -> Iterator[Registry]:
    started = Registry(session_dir / "registries", f"first-{uuid.uuid4().hex[:6]}").start()
    yield started
    started.stop()


torpor = run_torpor   # (tests/conftest.py)


def start_counter(node: Node, test_image: dict[str, object], name: str) -> None:
    node.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c", COUNTER)
    wait_counter_above(node, name, 2)


def test_restore_refuses_a_taken_or_bad_name_before_any_download(
        first_node: Node, registry: Registry, test_image: dict[str, object],
        session_dir: Path) -> None:
    """`torpor restore REF` where the container's name is taken (the README's own restore on
    the checkpointing node), or with an invalid --name, is refused before a layer comes down:
    no layer blob is asked of the registry, nothing lands in the store, no image in containerd."""
    node = first_node
    name = "taken"
    ref = f"{registry.host}/first/{name}:1"
    store = session_dir / "first-hour" / "store"
    with containers(node) as on_node:
        on_node.append(name)
        start_counter(node, test_image, name)
        torpor(node, "checkpoint", name, "-t", ref, "--push", "--leave-running")
        torpor(node, "rm", ref)   # from the registry, not the local store
        images_before = node.ctr("images", "ls", "-q").stdout.split()
        layers = registry.layer_digests(f"first/{name}", "1")

        mark = registry.log_mark()
        taken = torpor(node, "restore", ref, check=False)
        assert taken.returncode != 0
        assert f"container {name} already exists" in taken.stderr
        assert "--name" in taken.stderr
        blobs = {r.rsplit("/", 1)[1] for r in registry.requests_since(mark) if "/blobs/" in r}
        assert blobs and not blobs & layers   # the metadata (configs) alone names the container

        for bad, words in ((name, f"container {name} already exists"),
                           ("bad name", "the container name 'bad name'")):
            mark = registry.log_mark()
            refused = torpor(node, "restore", ref, "--name", bad, check=False)
            assert refused.returncode != 0
            assert words in refused.stderr, refused.stderr
            assert registry.requests_since(mark) == []   # not even the index

        assert not list(store.glob("images/*/layout/blobs/sha256/*"))
        assert not list(store.glob("scratch/*"))
        assert node.ctr("images", "ls", "-q").stdout.split() == images_before
        assert task_status(node, name) == "RUNNING"


def test_restore_from_the_store_refuses_a_taken_name_before_unpacking(
        first_node: Node, registry: Registry, test_image: dict[str, object]) -> None:
    """The same refusal for a local image: nothing unpacked, no image imported into containerd."""
    node = first_node
    name = "taken-local"
    ref = f"{registry.host}/first/{name}:1"
    with containers(node) as on_node:
        on_node.append(name)
        start_counter(node, test_image, name)
        torpor(node, "checkpoint", name, "-t", ref, "--leave-running")
        images_before = node.ctr("images", "ls", "-q").stdout.split()
        refused = torpor(node, "restore", ref, check=False)
        assert refused.returncode != 0
        assert f"container {name} already exists" in refused.stderr
        assert ref not in node.ctr("images", "ls", "-q").stdout.split()
        assert node.ctr("images", "ls", "-q").stdout.split() == images_before
        torpor(node, "rm", ref)


@pytest.mark.parametrize("problem", ["unreachable", "bad-credentials"])
def test_checkpoint_to_a_registry_checks_it_before_the_dump(
        first_node: Node, session_dir: Path, test_image: dict[str, object],
        tmp_path: Path, problem: str) -> None:
    """`torpor checkpoint C -t REG/x:1 --push` asks the registry (reachable, the credentials
    accepted for a push) before CRIU touches C: C runs on with the same process, counting."""
    node = first_node
    name = f"push-{problem}"
    env: dict[str, str] = {}
    locked: Registry | None = None
    if problem == "unreachable":
        host = f"127.0.0.1:{free_port()}"   # nothing listens there
    else:
        locked = Registry(session_dir / "registries", f"locked-{uuid.uuid4().hex[:6]}",
                          users={"alice": "right-pw"}).start()
        host = locked.host
        env["DOCKER_CONFIG"] = str(docker_config(tmp_path / "docker",
                                                 {host: ("alice", "wrong-pw")}).parent)
    try:
        with containers(node) as on_node:
            on_node.append(name)
            start_counter(node, test_image, name)
            pid = task_pid(node, name)
            result = torpor(node, "checkpoint", name, "-t", f"{host}/first/{name}:1", "--push",
                            check=False, env=env)
            assert result.returncode != 0
            assert host in result.stderr
            assert "checked before checkpointing" in result.stderr, result.stderr
            assert "checkpointing the task" not in result.stderr   # CRIU never ran
            assert task_status(node, name) == "RUNNING" and task_pid(node, name) == pid
            wait_counter_above(node, name, read_counter(node, name) + 3)
    finally:
        if locked is not None:
            locked.stop()


def test_errors_name_the_input_and_the_fix(first_node: Node, registry: Registry,
                                           test_image: dict[str, object],
                                           tmp_path: Path) -> None:
    """The errors a new user meets, in their words: a path that is not there, a layout copied
    without --all, a container in another namespace, an encrypted checkpoint inspected without
    its key."""
    node = first_node
    missing = str(tmp_path / "no-such-checkpoint")
    for verb in ("restore", "inspect", "push"):
        result = torpor(node, verb, missing, *(["reg.example/x:1"] if verb == "push" else []),
                        check=False)
        assert result.returncode != 0
        assert f"{missing}: no such file or directory, and not an image reference" \
            in result.stderr, result.stderr
    result = torpor(node, "restore", "Not_A/Ref", check=False)
    assert "Not_A/Ref: no such file or directory, and not an image reference" in result.stderr

    name = "words"
    ref = f"{registry.host}/first/{name}:1"
    with containers(node) as on_node:
        on_node.append(name)
        start_counter(node, test_image, name)
        torpor(node, "checkpoint", name, "-t", ref, "--push", "--leave-running")
        copied = tmp_path / "copied"
        subprocess.run(["skopeo", "copy", "--src-tls-verify=false", f"docker://{ref}",
                        f"oci:{copied}:ckpt"], check=True, capture_output=True)
        result = torpor(node, "restore", str(copied), "--name", "words-b", check=False)
        assert result.returncode != 0
        assert "skopeo copy --all" in result.stderr, result.stderr

        result = torpor(node, "-n", "elsewhere", "checkpoint", name, "-o", str(tmp_path / "d"),
                        check=False)
        assert result.returncode != 0
        assert "not found" in result.stderr
        assert "namespace elsewhere" in result.stderr and "-n NAMESPACE" in result.stderr
        assert "--address" in result.stderr

        key = tmp_path / "k.pem"
        subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-out", str(key)], check=True)
        subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out",
                        str(tmp_path / "k.pub")], check=True)
        layout = tmp_path / "encrypted"
        torpor(node, "checkpoint", name, "-o", str(layout), "--oci", "--leave-running",
               "--encrypt-recipient", f"jwe:{tmp_path / 'k.pub'}")
        sealed = torpor(node, "inspect", str(layout)).stdout
        for what in ("processes", "network", "mounts"):
            assert re.search(rf"^{what} +encrypted \(give --decryption-key", sealed, re.M), sealed
        opened = torpor(node, "inspect", str(layout), "--decryption-key", str(key)).stdout
        assert re.search(r"^mounts +/proc \(proc\)", opened, re.M), opened
        # a namespace runc made ended with its container: no /proc path of a dead process
        network = next(line for line in opened.splitlines() if line.startswith("network"))
        assert "its own namespace: a restore makes a new one" in network, network
        assert "/proc/" not in network, network
        torpor(node, "rm", ref)


def test_rm_removes_the_image_a_restore_imported(first_node: Node, registry: Registry,
                                                 test_image: dict[str, object]) -> None:
    """What torpor made, it removes: `torpor rm REF` also deletes the runnable image that
    `torpor restore REF` imported into containerd; an image of that name torpor did not make
    stays."""
    node = first_node
    name = "rm-leftover"
    ref = f"{registry.host}/first/{name}:1"
    with containers(node) as on_node:
        on_node += [name, "rm-restored"]
        start_counter(node, test_image, name)
        torpor(node, "checkpoint", name, "-t", ref, "--leave-running")
        torpor(node, "restore", ref, "--name", "rm-restored")
        assert ref in node.ctr("images", "ls", "-q").stdout.split()
        node.ctr("tasks", "delete", "--force", "rm-restored")
        node.ctr("containers", "delete", "rm-restored")
        out = torpor(node, "rm", ref).stdout
        assert "and its image in containerd" in out
        assert ref not in node.ctr("images", "ls", "-q").stdout.split()
        # not torpor's: kept
        node.ctr("images", "tag", str(test_image["name"]), ref)
        torpor(node, "checkpoint", name, "-t", ref, "--leave-running")
        torpor(node, "rm", ref)
        assert ref in node.ctr("images", "ls", "-q").stdout.split()
        node.ctr("images", "rm", ref)


def test_what_a_restore_makes_goes_with_its_container(first_node: Node, session_dir: Path,
                                                      tmp_path: Path,
                                                      test_image: dict[str, object]) -> None:
    """What torpor made, it removes, and it is where the docs say: the /etc/hosts a restore
    gives a container that had its engine's (torpor's own copy, in the state directory's
    pod-files/) goes when that container is deleted with ctr (`torpor recover`, and the next
    restore, sweep it) and stays while the container mounts it; a restore that fails leaves none;
    the task's output is in `[runtime] log_dir`."""
    node = first_node
    base = session_dir / "first-hour"
    files_root = base / "state" / "pod-files"
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n10.9.8.7 engine-made\n")
    name, a, b = "own-files", "own-files-a", "own-files-b"

    def made() -> list[str]:
        return sorted(p.name for p in files_root.iterdir() if "-own-files-" in p.name) \
            if files_root.is_dir() else []

    with containers(node) as on_node:
        on_node += [name, a, b]
        node.ctr("run", "-d", *SHIM, "--mount",
                 f"type=bind,src={hosts},dst=/etc/hosts,options=rbind:ro",
                 str(test_image["name"]), name, "sh", "-c", COUNTER)
        wait_counter_above(node, name, 2)
        checkpoint = tmp_path / "ck"
        torpor(node, "checkpoint", name, "-o", str(checkpoint), "--leave-running")
        torpor(node, "restore", str(checkpoint), "--name", a)
        torpor(node, "restore", str(checkpoint), "--name", b)
        assert [m.split(f"{node.namespace}-")[1][:len(a)] for m in made()] == [a, b], made()
        assert "localhost" in read_file(node, b, "/etc/hosts")
        assert (base / "state-logs" / f"{node.namespace}-{a}.log").is_file()
        # a restore that fails once its files are made (the task's logger cannot start)
        failed = torpor(node, "restore", str(checkpoint), "--name", "own-files-c",
                        "--log-uri", f"binary://{tmp_path}/no-such-logger", check=False)
        assert failed.returncode != 0
        assert len(made()) == 2, made()
        # a deleted with ctr: its files go at the next sweep; b's stay, and b runs on
        node.ctr("tasks", "delete", "--force", a)
        node.ctr("containers", "delete", a)
        out = torpor(node, "recover").stdout
        assert "sandbox files of a restored container that is gone" in out, out
        assert len(made()) == 1 and f"-{b}-" in made()[0], made()
        assert "localhost" in read_file(node, b, "/etc/hosts")
        count = read_counter(node, b)
        wait_counter_above(node, b, count)
    torpor(node, "recover")   # b deleted too (containers()): the sweep takes its files
    assert made() == [], made()
