"""Checkpoint images: checkpoint on node A, push to a real registry, pull and restore on node B
(each containerd in its own network namespace); stock tools read what torpor wrote; bad images
are refused in words, with nothing written outside their target and no container left."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Nodes, run_torpor
from .support import oci_edit
from .support.containerd import Node
from .support.registry import Registry, docker_config
from .support.workload import (
    COUNTER,
    containers,
    kv_ask,
    read_counter,
    task_status,
    wait_counter_above,
    wait_kv,
)

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]


def node_config(session_dir: Path, name: str) -> Path:
    """Each node its own torpor state and image store: two machines, not one."""
    path = session_dir / f"node-{name}.toml"
    path.write_text(f'[runtime]\nstate_dir = "{session_dir}/{name}-state"\n'
                    f'log_dir = "{session_dir}/{name}-state-logs"\n'
                    f'[image]\nstore = "{session_dir}/{name}-store"\n')
    return path


@pytest.fixture(scope="module")
def two_nodes(nodes: Nodes, session_dir: Path) -> tuple[Node, Node]:
    a = nodes.start("img-a", own_netns=True, config=node_config(session_dir, "img-a"))
    b = nodes.start("img-b", own_netns=True, config=node_config(session_dir, "img-b"))
    return a, b


@pytest.fixture(scope="module")
def registries(session_dir: Path) -> Iterator[dict[str, Registry]]:
    base = session_dir / "registries"
    started = {
        "plain": Registry(base, "plain").start(),
        "basic": Registry(base, "basic", users={"alice": "s3cret-pw"}).start(),
        "tls": Registry(base, "tls", tls=True).start(),
    }
    yield started
    for registry in started.values():
        registry.stop()


torpor = run_torpor   # (tests/conftest.py)


@pytest.mark.parametrize("kind", ["plain", "basic", "tls"])
def test_state_moves_to_another_node(two_nodes: tuple[Node, Node],
                                     registries: dict[str, Registry], tmp_path: Path,
                                     test_image: dict[str, object], kind: str) -> None:
    a, b = two_nodes
    registry = registries[kind]
    env: dict[str, str] = {}
    extra: list[str] = []
    if kind == "basic":
        config_json = docker_config(tmp_path / "docker", {registry.host: ("alice", "s3cret-pw")})
        env["DOCKER_CONFIG"] = str(config_json.parent)
    if kind == "tls":
        extra = ["--ca-file", str(registry.ca_file)]
    name = f"move-{kind}"
    ref = f"{registry.host}/team/{name}:ckpt-1"
    with containers(a) as on_a, containers(b) as on_b:
        on_a.append(name)
        on_b.append(name)
        a.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c",
              f"kvserver 7000 & {COUNTER}")
        wait_kv(a, name)
        assert kv_ask(a, name, "SET owner alice") == "OK"
        assert kv_ask(a, name, "INCR visits") == "1"
        before = wait_counter_above(a, name, 10)
        out = torpor(a, "checkpoint", name, "-t", ref, "--push", "--json", *extra, env=env)
        pushed = json.loads(out.stdout)
        assert pushed["pushed"]["reference"].startswith(ref)
        assert task_status(a, name) == "STOPPED"

        torpor(b, "restore", ref, *extra, env=env)
        assert kv_ask(b, name, "GET owner") == "alice"
        assert kv_ask(b, name, "INCR visits") == "2"
        resumed = read_counter(b, name)
        assert resumed >= before
        wait_counter_above(b, name, resumed + 3)
        # the image is in B's local store now
        listed = json.loads(torpor(b, "ls", "--json").stdout)
        assert ref in [entry["ref"] for entry in listed]


@pytest.fixture(scope="module")
def pushed_image(two_nodes: tuple[Node, Node], registries: dict[str, Registry],
                 test_image: dict[str, object]) -> Iterator[dict[str, str]]:
    """One checkpoint image in the plain registry, from a container left running on A."""
    a, _ = two_nodes
    registry = registries["plain"]
    ref = f"{registry.host}/team/shared:ckpt-1"
    a.ctr("run", "-d", *SHIM, str(test_image["name"]), "shared", "sh", "-c",
          "echo 'state of the rootfs' > /root/note; rm /etc/group; "
          f"kvserver 7000 & {COUNTER}")
    wait_kv(a, "shared")
    torpor(a, "checkpoint", "shared", "-t", ref, "--push", "--leave-running")
    yield {"ref": ref, "host": registry.host}
    a.ctr("tasks", "delete", "--force", "shared", check=False)
    a.ctr("containers", "rm", "shared", check=False)


def test_incompatible_node_is_refused_before_download(two_nodes: tuple[Node, Node],
                                                      pushed_image: dict[str, str],
                                                      tmp_path: Path, session_dir: Path) -> None:
    a, b = two_nodes
    layout = tmp_path / "layout"
    torpor(a, "pull", pushed_image["ref"], "-o", str(layout))

    def require_more(state: dict, metadata: dict, _: Path) -> None:  # type: ignore[type-arg]
        metadata["node"]["criu_version"] = "9.9.0"
        metadata["node"]["cpu_flags"] = [*metadata["node"]["cpu_flags"], "avx1024_quantum"]

    oci_edit.edit(layout, require_more)
    ref = f"{pushed_image['host']}/team/shared:needs-more"
    torpor(a, "push", str(layout), ref)
    result = torpor(b, "restore", ref, "--name", "refused", check=False)
    assert result.returncode == 3
    assert "criu: this node has 4.2.1, the checkpoint needs 9.9.0 or newer" in result.stderr
    assert "CPU features: this node lacks avx1024_quantum" in result.stderr
    # refused before any layer was downloaded: B's store has no copy of it at all
    store = session_dir / "img-b-store" / "images"
    refs = [p.read_text() for p in store.glob("*/ref")] if store.exists() else []
    assert ref not in refs
    assert "refused" not in b.ctr("containers", "ls", "-q").stdout.split()


def test_stock_tools_read_the_image(two_nodes: tuple[Node, Node], nodes: Nodes,
                                    pushed_image: dict[str, str], tmp_path: Path) -> None:
    ref = pushed_image["ref"]
    raw = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{ref}"],
                         check=True, capture_output=True, text=True).stdout
    index = json.loads(raw)
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    roles = {m["annotations"]["io.torpor.checkpoint.role"] for m in index["manifests"]}
    assert roles == {"runnable", "state"}
    info = json.loads(subprocess.run(["skopeo", "inspect", "--tls-verify=false",
                                      f"docker://{ref}"], check=True, capture_output=True,
                                     text=True).stdout)
    assert info["Os"] == "linux" and len(info["Layers"]) == 2
    subprocess.run(["skopeo", "copy", "--src-tls-verify=false", f"docker://{ref}",
                    f"oci:{tmp_path / 'copied'}:ckpt"], check=True, capture_output=True)
    assert (tmp_path / "copied" / "index.json").exists()
    # a fresh node without torpor's help: ctr pulls and runs the runnable manifest, cold
    _, b = two_nodes
    b.ctr("images", "pull", "--plain-http", ref)
    cold = b.ctr("run", "--rm", ref, "cold-start", "sh", "-c",
                 "cat /root/note; ls /etc/group 2>&1; true").stdout
    assert "state of the rootfs" in cold and "No such file" in cold


def test_inspect_ls_rm(two_nodes: tuple[Node, Node], pushed_image: dict[str, str]) -> None:
    a, b = two_nodes
    info = json.loads(torpor(b, "inspect", pushed_image["ref"], "--json").stdout)
    assert info["container"] == "shared" and info["kind"] == "registry"
    assert pushed_image["ref"] not in torpor(b, "ls").stdout  # inspected from metadata alone
    names = {p["name"] for p in info["processes"]}
    assert {"sh", "kvserver"} <= names
    assert any(s["port"] == 7000 and s["state"] == "listen" for s in info["network"]["sockets"])
    kinds = {layer["mediaType"] for layer in info["layers"]}
    assert {"application/vnd.torpor.checkpoint.chunk-index.v1+json+zstd",
            "application/vnd.torpor.checkpoint.pack.v1"} <= kinds
    assert info["sizes"]["memory_pages"] > 0 and info["node"]["criu_version"] == "4.2.1"
    text = torpor(a, "inspect", pushed_image["ref"]).stdout
    assert "kvserver" in text and "layers" in text
    assert pushed_image["ref"] in torpor(a, "ls").stdout
    local = json.loads(torpor(a, "inspect", pushed_image["ref"], "--json").stdout)
    assert local["digest"] == info["digest"] and local["kind"] == "store"
    torpor(a, "rm", pushed_image["ref"])
    assert pushed_image["ref"] not in torpor(a, "ls").stdout
    assert "no local checkpoint image" in torpor(a, "rm", pushed_image["ref"],
                                                  check=False).stderr


def test_oci_layout_directory_round_trip(two_nodes: tuple[Node, Node], tmp_path: Path,
                                         test_image: dict[str, object]) -> None:
    a, b = two_nodes
    with containers(a) as on_a, containers(b) as on_b:
        on_a.append("layout-src")
        on_b.append("layout-dst")
        a.ctr("run", "-d", *SHIM, str(test_image["name"]), "layout-src", "kvserver", "7000")
        wait_kv(a, "layout-src")
        kv_ask(a, "layout-src", "SET k layout")
        torpor(a, "checkpoint", "layout-src", "-o", str(tmp_path / "oci"), "--oci")
        assert json.loads((tmp_path / "oci" / "index.json").read_text())["manifests"]
        mode = (tmp_path / "oci").stat().st_mode & 0o777
        assert mode == 0o700
        torpor(b, "restore", str(tmp_path / "oci"), "--name", "layout-dst")
        assert kv_ask(b, "layout-dst", "GET k") == "layout"


# Bad images ----------------------------------------------------------------------------------

@pytest.fixture
def layout_copy(two_nodes: tuple[Node, Node], pushed_image: dict[str, str],
                tmp_path: Path) -> Path:
    a, _ = two_nodes
    layout = tmp_path / "layout"
    torpor(a, "pull", pushed_image["ref"], "-o", str(layout))
    return layout


def state_layers(layout: Path) -> list[dict]:  # type: ignore[type-arg]
    found: list[dict] = []  # type: ignore[type-arg]

    def grab(state: dict, metadata: dict, _: Path) -> None:  # type: ignore[type-arg]
        found.extend(state["layers"])

    oci_edit.edit(layout, grab)
    return found


def assert_nothing_left(b: Node, name: str, outside: Path | None = None) -> None:
    assert name not in b.ctr("containers", "ls", "-q").stdout.split()
    assert name not in b.ctr("snapshots", "ls").stdout
    if outside is not None:
        assert not outside.exists()


def malicious(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    if kind == tarfile.REGTYPE:
        info.size = 4
    return info


ESCAPES = {
    "dotdot": [malicious("criu/../../../escaped-dotdot")],
    "absolute": [malicious("/tmp/torpor-escaped-absolute")],
    "symlink": [malicious("criu/link", tarfile.SYMTYPE, "/etc"), malicious("criu/link/passwd")],
    "device": [malicious("criu/null", tarfile.CHRTYPE)],
    "outside": [malicious("etc/cron.d/evil")],
}


@pytest.mark.parametrize("attack", sorted(ESCAPES))
def test_unsafe_layer_entries_are_refused(two_nodes: tuple[Node, Node], layout_copy: Path,
                                          tmp_path: Path, attack: str) -> None:
    _, b = two_nodes
    entries = ESCAPES[attack]
    data = {e.name: b"evil" for e in entries if e.type == tarfile.REGTYPE}

    def add_layer(state: dict, metadata: dict, layout: Path) -> None:  # type: ignore[type-arg]
        state["layers"].append(oci_edit.blob(
            layout, "application/vnd.torpor.checkpoint.state.v1.tar+zstd",
            oci_edit.tar_zstd(entries, data)))

    oci_edit.edit(layout_copy, add_layer)
    result = torpor(b, "restore", str(layout_copy), "--name", f"unsafe-{attack}", check=False)
    assert result.returncode != 0
    assert "torpor: error:" in result.stderr and "Traceback" not in result.stderr
    assert any(word in result.stderr for word in ("absolute", "relative path", "link, device",
                                                   "outside", "symlink", "'..'"))
    assert_nothing_left(b, f"unsafe-{attack}")
    assert not Path("/tmp/torpor-escaped-absolute").exists()
    assert not list(tmp_path.parent.rglob("escaped-dotdot"))


def test_damaged_and_odd_images_are_refused(two_nodes: tuple[Node, Node], layout_copy: Path,
                                            tmp_path: Path) -> None:
    _, b = two_nodes
    layers = [layer for layer in state_layers(layout_copy)
              if layer["mediaType"].endswith("state.v1.tar+zstd")]
    blob = layout_copy / "blobs" / "sha256" / layers[0]["digest"].split(":")[1]
    original = blob.read_bytes()

    def attempt(name: str) -> str:
        result = torpor(b, "restore", str(layout_copy), "--name", name, check=False)
        assert result.returncode != 0, result.stdout
        assert "Traceback" not in result.stderr
        assert_nothing_left(b, name)
        return result.stderr

    blob.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
    assert "does not match its digest" in attempt("bad-digest")
    blob.write_bytes(original[: len(original) // 2])
    assert "truncated" in attempt("truncated")
    blob.unlink()
    assert "missing" in attempt("missing")
    blob.write_bytes(original)

    def unknown(state: dict, metadata: dict, layout: Path) -> None:  # type: ignore[type-arg]
        state["layers"].append(oci_edit.blob(layout, "application/vnd.example.mystery.v1",
                                             b"?"))

    pristine = tmp_path / "pristine"
    shutil.copytree(layout_copy, pristine)
    oci_edit.edit(layout_copy, unknown)
    assert "unknown media type 'application/vnd.example.mystery.v1'" in attempt("unknown-type")

    def huge(state: dict, metadata: dict, layout: Path) -> None:  # type: ignore[type-arg]
        state["annotations"]["padding"] = "x" * (5 << 20)

    oci_edit.edit(pristine, huge)
    shutil.rmtree(layout_copy)
    shutil.copytree(pristine, layout_copy)
    assert "more than the limit" in attempt("huge-manifest")


def test_tampered_registry_blob_is_refused(two_nodes: tuple[Node, Node],
                                           registries: dict[str, Registry],
                                           pushed_image: dict[str, str]) -> None:
    a, b = two_nodes
    registry = registries["plain"]
    info = json.loads(torpor(a, "inspect", pushed_image["ref"], "--json").stdout)
    criu = next(layer for layer in info["layers"]
                if layer["mediaType"] == "application/vnd.torpor.checkpoint.pack.v1")
    data = registry.blob_data(criu["digest"])
    original = data.read_bytes()
    try:
        data.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
        result = torpor(b, "restore", pushed_image["ref"], "--name", "tampered", check=False)
        assert result.returncode != 0
        assert criu["digest"] in result.stderr
        assert_nothing_left(b, "tampered")
    finally:
        data.write_bytes(original)
    os.sync()
