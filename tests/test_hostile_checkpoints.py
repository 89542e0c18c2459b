"""A hostile corpus: tampered copies of one genuine checkpoint (a container with a volume, a
read-write layer and a listening server), as a checkpoint directory, an OCI layout, an image in a
registry and an encrypted layout, each restored with `torpor restore` on a node whose policy is
the default. Each is refused with a clear error (no traceback, no container, task or snapshot
left, no scratch space) or restored safely; either way a canary tree outside every target is
unchanged, byte for byte, metadata included (tests/support/hostile.py: tree_digest).

The attacks: archive escapes through symlinks, hard links, whiteouts (`.wh..`, `.wh...`, `.wh.`,
through symlinks, aufs' own), `..` and absolute names, device nodes and FIFOs, in the volumes
and the read-write layer torpor-runc extracts, and in state layers; what the spec asks (hooks,
a root on the host, host mounts and volumes written into host paths, devices, capabilities,
host or joined namespaces, cgroup paths); the metadata and torpor-runc's state (unknown
versions, unsafe paths, archives named outside); the directory itself (symlinks, FIFOs,
unlisted and truncated files); the image (a 131 KB layer inflating to 4 GiB, declared or not,
10,000 layers, oversize manifests and configs, wrong digests, truncated and missing blobs,
unknown media types, swapped base layers, bad digests in index.json); ciphertext altered and
clear metadata that disagrees with the encrypted one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import Nodes
from .support import oci_edit
from .support.containerd import Node
from .support.hostile import (
    UP,
    archive_escapes,
    entry,
    make_canary,
    tar_bytes,
    tree_digest,
    zstd,
    zstd_bomb_tar,
)
from .support.registry import Registry
from .support.workload import remove, wait_kv

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]
STATE_LAYER = "application/vnd.torpor.checkpoint.state.v1.tar+zstd"
BOMB_SIZE = 4 << 30


@dataclass
class World:
    node: Node
    canary: Path
    directory: Path      # the genuine checkpoint directory
    layout: Path         # the genuine checkpoint as an OCI layout
    registry: Registry
    bomb: bytes          # tar+zstd: criu/pages-1.img of 4 GiB of zeros, ~131 KB
    keys: Path


@pytest.fixture(scope="module")
def corpus(nodes: Nodes, session_dir: Path, test_image: dict[str, object],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = session_dir / "hostile"
    base.mkdir()
    config = base / "node.toml"   # the default policy: nothing granted
    config.write_text(f'[runtime]\nstate_dir = "{base}/state"\n'
                      f'log_dir = "{base}/state-logs"\n[image]\nstore = "{base}/store"\n')
    node = nodes.start("hostile", config=config)
    canary = make_canary(base / "canary")
    volume = base / "volume"
    volume.mkdir()
    node.ctr("run", "-d", *SHIM, "--mount", f"type=bind,src={volume},dst=/data,options=rbind:rw",
             str(test_image["name"]), "genuine", "sh", "-c",
             "echo v > /data/v; mkdir /data/sub; echo note > /root/note; exec kvserver 7000")
    wait_kv(node, "genuine")
    torpor(node, "checkpoint", "genuine", "-o", str(base / "dir"), "--leave-running")
    torpor(node, "checkpoint", "genuine", "-o", str(base / "layout"), "--oci")
    remove(node, "genuine")
    keys = tmp_path_factory.mktemp("hostile-keys")
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-out", str(keys / "k.pem")], check=True)
    subprocess.run(["openssl", "pkey", "-in", str(keys / "k.pem"), "-pubout", "-out",
                    str(keys / "k.pub")], check=True)
    registry = Registry(base / "registry", "plain").start()
    try:
        yield World(node, canary, base / "dir", base / "layout", registry,
                    zstd_bomb_tar("criu/pages-1.img", BOMB_SIZE, level=3), keys)
    finally:
        registry.stop()


def torpor(node: Node, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(node.bin_dir / "torpor"), *args], capture_output=True,
                            text=True, env=node.env, timeout=300)
    if check:
        assert result.returncode == 0, f"torpor {' '.join(args)}: {result.stdout}{result.stderr}"
    return result


# Tampering with a checkpoint directory ------------------------------------------------------

def metadata_of(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "checkpoint.json").read_text())


def save_metadata(directory: Path, document: dict[str, Any]) -> None:
    (directory / "checkpoint.json").write_text(json.dumps(document))


def put_file(directory: Path, rel: str, data: bytes) -> None:
    """Write a file into the directory and list it in checkpoint.json at its size."""
    path = directory / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    document = metadata_of(directory)
    files = [f for f in document["files"] if f["path"] != rel]
    document["files"] = [*files, {"path": rel, "size": len(data)}]
    save_metadata(directory, document)


def edit_spec(change: Callable[[dict[str, Any], Path], None]) -> Callable[[Path, World], None]:
    def tamper(directory: Path, w: World) -> None:
        document = metadata_of(directory)
        change(document["container"]["spec"], w.canary)
        save_metadata(directory, document)
    return tamper


def edit_state_json(change: Callable[[dict[str, Any], Path], None]) -> Callable[[Path, World], None]:
    def tamper(directory: Path, w: World) -> None:
        state = json.loads((directory / "criu/torpor-state.json").read_text())
        change(state, w.canary)
        put_file(directory, "criu/torpor-state.json", json.dumps(state).encode())
    return tamper


def hostile_volume(case: str) -> Callable[[Path, World], None]:
    def tamper(directory: Path, w: World) -> None:
        put_file(directory, "criu/torpor-volume-0.tar", tar_bytes(archive_escapes(w.canary)[case][1]))
    return tamper


def hostile_rootfs(case: str, where: str) -> Callable[[Path, World], None]:
    def tamper(directory: Path, w: World) -> None:
        put_file(directory, where, tar_bytes(archive_escapes(w.canary)[case][1]))
    return tamper


def add_hook(spec: dict[str, Any], canary: Path) -> None:
    spec.setdefault("hooks", {})["prestart"] = [
        {"path": "/bin/sh", "args": ["sh", "-c", f"touch {canary}/pwned"]}]


def add_mount(spec: dict[str, Any], canary: Path) -> None:
    spec["mounts"].append({"destination": "/host", "type": "bind", "source": str(canary),
                           "options": ["rbind", "rw"]})


def volume_into_canary(spec: dict[str, Any], canary: Path) -> None:
    for mount in spec["mounts"]:
        if mount["destination"] == "/data":
            mount["source"] = str(canary / "victim")


def set_in(path: str, value: Any) -> Callable[[dict[str, Any], Path], None]:
    def change(document: dict[str, Any], canary: Path) -> None:
        *parents, last = path.split(".")
        for key in parents:
            document = document.setdefault(key, {})
        document[last] = value(canary) if callable(value) else value
    return change


def without_namespace(kind: str) -> Callable[[dict[str, Any], Path], None]:
    def change(spec: dict[str, Any], _: Path) -> None:
        spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"] if n["type"] != kind]
    return change


def join_host_netns(spec: dict[str, Any], _: Path) -> None:
    for ns in spec["linux"]["namespaces"]:
        if ns["type"] == "network":
            ns["path"] = "/proc/1/ns/net"


def with_capability(spec: dict[str, Any], _: Path) -> None:
    for values in spec["process"]["capabilities"].values():
        values.append("CAP_SYS_ADMIN")


def hook_calling_itself_torpors(stage: str) -> Callable[[dict[str, Any], Path], None]:
    """A host program dressed as torpor's own hook: what a hook calls itself proves nothing."""
    def change(spec: dict[str, Any], canary: Path) -> None:
        spec.setdefault("hooks", {})[stage] = [
            {"path": "/bin/sh", "args": ["torpor-hook", "-c", f"touch {canary}/pwned"]}]
    return change


def criu_config_annotation(spec: dict[str, Any], canary: Path) -> None:
    """org.criu.config: runc hands the file to CRIU, whose action script runs as root."""
    place = canary.parent / "criu-config"
    place.mkdir(exist_ok=True)
    script = place / "action.sh"
    script.write_text(f"#!/bin/sh\ntouch {canary}/pwned\n")
    script.chmod(0o755)
    (place / "evil.conf").write_text(f"action-script {script}\n")
    spec.setdefault("annotations", {})["org.criu.config"] = str(place / "evil.conf")


def acted_on_annotation(key: str, value: str) -> Callable[[dict[str, Any], Path], None]:
    def change(spec: dict[str, Any], _: Path) -> None:
        spec.setdefault("annotations", {})[key] = value
    return change


def criu_symlink(directory: Path, w: World) -> None:
    pages = next((directory / "criu").glob("pages-*.img"))
    pages.unlink()
    pages.symlink_to(w.canary / "secret")


def criu_fifo(directory: Path, _: World) -> None:
    os.mkfifo(directory / "criu" / "fifo.img")


def unlisted(directory: Path, _: World) -> None:
    (directory / "criu" / "extra.img").write_bytes(b"x")


def truncated(directory: Path, _: World) -> None:
    pages = next((directory / "criu").glob("pages-*.img"))
    with open(pages, "r+b") as f:
        f.truncate(pages.stat().st_size // 2)


def metadata_symlink(directory: Path, w: World) -> None:
    (directory / "checkpoint.json").unlink()
    (directory / "checkpoint.json").symlink_to(w.canary / "secret")


def meta(change: Callable[[dict[str, Any], Path], None]) -> Callable[[Path, World], None]:
    def tamper(directory: Path, w: World) -> None:
        document = metadata_of(directory)
        change(document, w.canary)
        save_metadata(directory, document)
    return tamper


def unsafe_file(document: dict[str, Any], _: Path) -> None:
    document["files"].append({"path": "../../../escaped", "size": 1})


def archive_outside(state: dict[str, Any], canary: Path) -> None:
    state["files"]["volumes"][0]["archive"] = f"{UP}{str(canary).lstrip('/')}/secret"


DIRECTORY_CASES: dict[str, tuple[Callable[[Path, World], None], bool, str]] = {
    # name: (tamper, pass --volume for /data, words expected in the refusal or "" if any)
    **{f"volume-{case}": (hostile_volume(case), True, "")
       for case, (mode, _) in archive_escapes(Path("/")).items() if mode == "volume"},
    **{f"rw-layer-{case}": (hostile_rootfs(case, "criu/torpor-rootfs-diff.tar"), True, "")
       for case, (mode, _) in archive_escapes(Path("/")).items()},
    **{f"containerd-diff-{case}": (hostile_rootfs(case, "rootfs-diff.tar"), True, "")
       for case in ("whiteout-dotdot", "symlink-then-write-through", "hardlink-dotdot")},
    "spec-hook": (edit_spec(add_hook), True, "prestart hook /bin/sh"),
    "spec-prestart-hook-named-torpor-hook": (edit_spec(hook_calling_itself_torpors("prestart")),
                                             True, "prestart hook /bin/sh torpor-hook"),
    "spec-poststart-hook-named-torpor-hook": (
        edit_spec(hook_calling_itself_torpors("poststart")), True, "poststart hook /bin/sh"),
    # at the stages torpor writes its own: replaced by this node's, so it restores, safely
    "spec-createRuntime-hook-named-torpor-hook": (
        edit_spec(hook_calling_itself_torpors("createRuntime")), True, ""),
    "spec-criu-config": (edit_spec(criu_config_annotation), True, "annotation org.criu.config"),
    "spec-systemd-property": (edit_spec(acted_on_annotation(
        "org.systemd.property.ExecStopPost", "/bin/sh")), True,
        "annotation org.systemd.property.ExecStopPost"),
    "spec-containerd-annotation": (edit_spec(acted_on_annotation(
        "io.containerd.runc.v2.group", "other")), True, "annotation io.containerd.runc.v2.group"),
    # a restore-time option is the user's: the checkpoint's own is dropped, so it restores
    "spec-add-addresses": (edit_spec(acted_on_annotation(
        "io.torpor.restore.add-addresses", "true")), True, ""),
    "spec-hostname-with-newlines": (edit_spec(set_in("hostname", "h\n10.0.0.1 registry")), True,
                                    "is not a host name"),
    "metadata-container-id-is-a-path": (meta(set_in(
        "container.id", lambda canary: f"x/../../../../..{canary}")), True,
        "is not a valid name"),
    "state-container-id-is-a-path": (edit_state_json(set_in("container_id", "../../../etc")),
                                     True, "is not a valid name"),
    "spec-root-on-host": (edit_spec(set_in("root.path", str)), True, "root filesystem at"),
    "spec-root-dotdot": (edit_spec(set_in("root.path", "../../../../..")), True,
                         "root filesystem at"),
    "spec-host-mount": (edit_spec(add_mount), True, "bind mount of host path"),
    "spec-volume-into-host-path": (edit_spec(volume_into_canary), False,
                                   "bind mount of host path"),
    "spec-device-node": (edit_spec(set_in("linux.devices", [
        {"path": "/dev/hostdisk", "type": "b", "major": 8, "minor": 0}])), True,
        "device /dev/hostdisk (b 8:0)"),
    "spec-all-devices": (edit_spec(set_in("linux.resources.devices", [
        {"allow": True, "access": "rwm"}])), True, "access to devices a *:*"),
    "spec-capability": (edit_spec(with_capability), True, "capability CAP_SYS_ADMIN"),
    "spec-host-pid": (edit_spec(without_namespace("pid")), True, "the host's pid namespace"),
    "spec-host-mount-ns": (edit_spec(without_namespace("mount")), True, "the host's mount"),
    "spec-join-host-netns": (edit_spec(join_host_netns), True, "/proc/1/ns/net"),
    "spec-malformed-process": (edit_spec(set_in("process", "not an object")), True,
                               "process is not an object"),
    "spec-malformed-mounts": (edit_spec(set_in("mounts", [5, "x"])), True,
                              "mounts holds a non-object"),
    "spec-cgroup-dotdot": (edit_spec(set_in("linux.cgroupsPath", "/../../system.slice")), True,
                           "cgroup path"),
    "metadata-unknown-version": (meta(set_in("format", "torpor.checkpoint.v9")), True,
                                 "this torpor reads"),
    "metadata-unsafe-path": (meta(unsafe_file), True, "unsafe path"),
    "state-unknown-version": (edit_state_json(set_in("format", "torpor.container-state.v9")),
                              True, ""),
    "state-archive-outside": (edit_state_json(archive_outside), True, ""),
    "criu-image-symlink": (criu_symlink, True, "is a symlink"),
    "criu-fifo": (criu_fifo, True, "device, FIFO or socket"),
    "unlisted-file": (unlisted, True, "not a file the checkpoint lists"),
    "truncated-image": (truncated, True, "incomplete or damaged"),
    "metadata-symlink": (metadata_symlink, True, "symlink"),
}


# Tampering with an OCI layout ---------------------------------------------------------------

def add_layer(entries: list[tuple[tarfile.TarInfo, bytes]]) -> Callable[[Path, World], None]:
    def tamper(layout: Path, _: World) -> None:
        def change(state: dict[str, Any], metadata: dict[str, Any], root: Path) -> None:
            state["layers"].append(oci_edit.blob(root, STATE_LAYER, zstd(tar_bytes(entries))))
        oci_edit.edit(layout, change)
    return tamper


def criu_pages(metadata: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in metadata["files"] if f["path"].startswith("criu/pages-"))


def bomb_layer(declared: bool) -> Callable[[Path, World], None]:
    def tamper(layout: Path, w: World) -> None:
        def change(state: dict[str, Any], metadata: dict[str, Any], root: Path) -> None:
            name = "criu/pages-1.img"
            if declared:
                entry = next(f for f in metadata["files"] if f["path"] == name)
                entry["size"] = BOMB_SIZE
            state["layers"].append(oci_edit.blob(root, STATE_LAYER, w.bomb))
        oci_edit.edit(layout, change)
    return tamper


def many_layers(layout: Path, _: World) -> None:
    def change(state: dict[str, Any], metadata: dict[str, Any], root: Path) -> None:
        state["layers"] = state["layers"] * (10_000 // len(state["layers"]) + 1)
    oci_edit.edit(layout, change)


def state_change(change: Callable[[dict[str, Any], dict[str, Any], Path], None]
                 ) -> Callable[[Path, World], None]:
    def tamper(layout: Path, _: World) -> None:
        oci_edit.edit(layout, change)
    return tamper


def first_criu_blob(layout: Path) -> Path:
    found: list[dict[str, Any]] = []
    oci_edit.edit(layout, lambda state, metadata, root: found.extend(state["layers"]))
    criu = next(layer for layer in found if "pack.v1" in layer["mediaType"])  # CRIU's chunks
    return layout / "blobs" / "sha256" / criu["digest"].split(":")[1]


def flip_byte(layout: Path, _: World) -> None:
    blob = first_criu_blob(layout)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))


def truncate_blob(layout: Path, _: World) -> None:
    blob = first_criu_blob(layout)
    blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])


def missing_blob(layout: Path, _: World) -> None:
    first_criu_blob(layout).unlink()


def symlinked_blob(layout: Path, w: World) -> None:
    blob = first_criu_blob(layout)
    blob.unlink()
    blob.symlink_to(w.canary / "secret")


def unknown_type(state: dict[str, Any], metadata: dict[str, Any], root: Path) -> None:
    state["layers"].append(oci_edit.blob(root, "application/vnd.example.mystery.v1", b"?"))


def huge_manifest(state: dict[str, Any], metadata: dict[str, Any], root: Path) -> None:
    state.setdefault("annotations", {})["padding"] = "x" * (5 << 20)


def huge_config(state: dict[str, Any], metadata: dict[str, Any], root: Path) -> None:
    metadata["padding"] = "x" * (17 << 20)


def layout_meta(change: Callable[[dict[str, Any], Path], None]) -> Callable[[Path, World], None]:
    def tamper(layout: Path, w: World) -> None:
        oci_edit.edit(layout, lambda state, metadata, root: change(metadata, w.canary))
    return tamper


def layout_spec(change: Callable[[dict[str, Any], Path], None]) -> Callable[[Path, World], None]:
    return layout_meta(lambda metadata, canary: change(metadata["container"]["spec"], canary))


def swapped_base(metadata: dict[str, Any], _: Path) -> None:
    metadata["image"]["layers"][0]["digest"] = "sha256:" + "ab" * 32


def runnable_bomb(layout: Path, w: World) -> None:
    """The read-write layer replaced by a layer that inflates to 4 GiB (not declared)."""
    index = json.loads((layout / "index.json").read_text())
    top = index["manifests"][0]
    blobs = layout / "blobs" / "sha256"
    image_index = json.loads((blobs / top["digest"].split(":")[1]).read_bytes())
    entry_ = next(m for m in image_index["manifests"]
                  if m["annotations"]["io.torpor.checkpoint.role"] == "runnable")
    manifest = json.loads((blobs / entry_["digest"].split(":")[1]).read_bytes())
    manifest["layers"][-1] = oci_edit.blob(layout, manifest["layers"][-1]["mediaType"], w.bomb)
    data = json.dumps(manifest).encode()
    entry_.update(oci_edit.blob(layout, entry_["mediaType"], data))
    data = json.dumps(image_index).encode()
    top.update(oci_edit.blob(layout, top["mediaType"], data))
    (layout / "index.json").write_text(json.dumps(index))


def bad_index_digest(layout: Path, _: World) -> None:
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0]["digest"] = "sha256:../../../../etc/passwd"
    (layout / "index.json").write_text(json.dumps(index))


def encrypted(then: Callable[[Path], None]) -> Callable[[Path, World], None]:
    def tamper(layout: Path, w: World) -> None:
        from torpor.image.encrypt_layout import encrypt_layout
        from torpor.image.encryption_keys import load_recipient

        encrypt_layout(str(layout), [load_recipient(str(w.keys / "k.pub"))])
        then(layout)
    return tamper


def alter_ciphertext(layout: Path) -> None:
    """One byte of an encrypted CRIU layer changed, its descriptor's digest made to match: only
    the HMAC can tell (no key, no valid HMAC)."""
    def change(state: dict[str, Any], metadata: dict[str, Any], root: Path) -> None:
        layer = next(x for x in state["layers"] if "pack.v1" in x["mediaType"])
        data = bytearray((root / "blobs" / "sha256" / layer["digest"].split(":")[1]).read_bytes())
        data[len(data) // 3] ^= 0x01
        new = oci_edit.blob(root, layer["mediaType"], bytes(data))
        layer.update(digest=new["digest"], size=new["size"])
    oci_edit.edit(layout, change)


def disagreeing_clear_metadata(layout: Path) -> None:
    def change(state: dict[str, Any], metadata: dict[str, Any], root: Path) -> None:
        metadata["torpor_version"] = "0.0.0-forged"
    oci_edit.edit(layout, change)


LAYOUT_CASES: dict[str, tuple[Callable[[Path, World], None], str]] = {
    "layer-dotdot": (add_layer([entry(f"criu/{UP}escaped", data=b"x")]), "'..'"),
    "layer-absolute": (add_layer([entry("/tmp/torpor-escaped-absolute", data=b"x")]),
                       "absolute"),
    "layer-symlink": (add_layer([entry("criu/link", tarfile.SYMTYPE, "/etc"),
                                 entry("criu/link/passwd", data=b"x")]), "link, device"),
    "layer-hardlink": (add_layer([entry("criu/h", tarfile.LNKTYPE, "criu/pages-1.img")]),
                       "link, device"),
    "layer-device": (add_layer([entry("criu/null", tarfile.CHRTYPE, major=1, minor=3)]),
                     "link, device"),
    "layer-outside-criu": (add_layer([entry("etc/cron.d/evil", data=b"x")]), "outside"),
    "layer-unlisted-file": (add_layer([entry("criu/extra.img", data=b"x")]),
                            "not a file the checkpoint's metadata lists"),
    "zip-bomb-undeclared": (bomb_layer(declared=False), "says it is 4294967296 bytes"),
    "zip-bomb-declared": (bomb_layer(declared=True), "decompression bomb"),
    "zip-bomb-rw-layer": (runnable_bomb, "unpacks to more than"),
    "10000-layers": (many_layers, "more than the limit of 4096"),
    "wrong-digest": (flip_byte, "does not match its digest"),
    "truncated-blob": (truncate_blob, "truncated"),
    "missing-blob": (missing_blob, "missing"),
    "symlinked-blob": (symlinked_blob, ""),
    "unknown-media-type": (state_change(unknown_type), "unknown media type"),
    "oversize-manifest": (state_change(huge_manifest), "more than the limit"),
    "oversize-config": (state_change(huge_config), "more than the limit"),
    "metadata-unknown-version": (layout_meta(set_in("format", "torpor.checkpoint.v9")),
                                 "this torpor reads"),
    "metadata-unsafe-path": (layout_meta(unsafe_file), "unsafe path"),
    "spec-hook": (layout_spec(add_hook), "prestart hook /bin/sh"),
    "spec-host-mount": (layout_spec(add_mount), "bind mount of host path"),
    "swapped-base-layers": (layout_meta(swapped_base), "not the base image's"),
    "bad-digest-in-index": (bad_index_digest, ""),
    "encrypted-altered-ciphertext": (encrypted(alter_ciphertext), "fails its HMAC check"),
    "encrypted-forged-clear-metadata": (encrypted(disagreeing_clear_metadata),
                                        "does not agree with its clear metadata"),
}
REGISTRY_CASES = ("zip-bomb-declared", "10000-layers", "metadata-unknown-version", "spec-hook")


# Running them -------------------------------------------------------------------------------

def nothing_left(node: Node, name: str, base: Path) -> None:
    assert name not in node.ctr("containers", "ls", "-q").stdout.split()
    assert name not in node.ctr("tasks", "ls").stdout
    assert name not in node.ctr("snapshots", "ls").stdout
    assert not list((base / "store").glob("scratch/*"))
    assert not list((base / "state").glob(f"restore-work/*{name}*"))
    assert not list((base / "state").glob(f"containers/*/{name}/restore-grant.json"))


def attempt(w: World, name: str, source: str, extra: list[str],
            words: str) -> subprocess.CompletedProcess[str]:
    before = tree_digest(w.canary)
    base = w.canary.parent
    result = torpor(w.node, "restore", source, "--name", name, *extra, "--decryption-key",
                    str(w.keys / "k.pem"), check=False)
    reason = (result.stderr.strip().splitlines() or [""])[-1][:160]
    print(f"\n{name}: {'refused: ' + reason if result.returncode else 'restored safely'}")
    try:
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr
        if result.returncode != 0:
            assert "torpor: error:" in result.stderr, result.stderr
            assert words in result.stderr, result.stderr
            nothing_left(w.node, name, base)
        else:
            assert not words, f"restored, but should have been refused ({words})"
    finally:
        remove(w.node, name)
    assert tree_digest(w.canary) == before, "the canary tree changed"
    assert not list(base.rglob("*escaped*")) and not Path("/tmp/torpor-escaped-absolute").exists()
    assert not (w.canary / "pwned").exists()
    return result


@pytest.mark.parametrize("case", sorted(DIRECTORY_CASES))
def test_tampered_checkpoint_directory(corpus: World, tmp_path: Path, case: str) -> None:
    tamper, grant_volume, words = DIRECTORY_CASES[case]
    copy = tmp_path / "ck"
    shutil.copytree(corpus.directory, copy, symlinks=True)
    tamper(copy, corpus)
    volume = tmp_path / "volume"
    volume.mkdir()
    extra = ["--volume", f"/data={volume}"] if grant_volume else []
    result = attempt(corpus, f"hd-{case}"[:40], str(copy), extra, words)
    if result.returncode == 0:   # restored safely: the volume is what the archive holds, inside
        assert all(str(p.resolve()).startswith(str(volume)) or p.is_symlink()
                   for p in volume.rglob("*"))


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_tampered_oci_layout(corpus: World, tmp_path: Path, case: str) -> None:
    tamper, words = LAYOUT_CASES[case]
    copy = tmp_path / "layout"
    shutil.copytree(corpus.layout, copy, symlinks=True)
    tamper(copy, corpus)
    volume = tmp_path / "volume"
    volume.mkdir()
    result = attempt(corpus, f"hl-{case}"[:40], str(copy), ["--volume", f"/data={volume}"],
                     words)
    assert result.returncode != 0, "every tampered layout is refused"


@pytest.mark.parametrize("case", REGISTRY_CASES)
def test_tampered_image_in_a_registry(corpus: World, tmp_path: Path, case: str) -> None:
    tamper, words = LAYOUT_CASES[case]
    copy = tmp_path / "layout"
    shutil.copytree(corpus.layout, copy, symlinks=True)
    tamper(copy, corpus)
    ref = f"{corpus.registry.host}/hostile/{case}:1"
    torpor(corpus.node, "push", str(copy), ref, "--insecure")
    result = attempt(corpus, f"hr-{case}"[:40], ref, ["--insecure"], words)
    assert result.returncode != 0
    stored = list((corpus.canary.parent / "store").glob("images/*/layout/blobs/sha256/*"))
    assert all(p.stat().st_size < 1 << 20 for p in stored)   # refused before any layer came


def test_what_the_user_grants_is_honoured_and_checked_again(corpus: World, tmp_path: Path) -> None:
    """The other side of the policy: a hook granted with --allow-spec-hooks runs (torpor-runc
    accepts the grant torpor restore left, then takes it), a bind mount accepted with
    --volume DEST is restored into the source the checkpoint names."""
    copy = tmp_path / "ck"
    shutil.copytree(corpus.directory, copy, symlinks=True)
    marker = tmp_path / "hook-ran"
    document = metadata_of(copy)
    document["container"]["spec"].setdefault("hooks", {})["createRuntime"] = [
        {"path": "/bin/sh", "args": ["sh", "-c", f"echo granted > {marker}"]}]
    save_metadata(copy, document)
    refused = torpor(corpus.node, "restore", str(copy), "--name", "hg-refused", "--volume",
                     "/data", check=False)
    assert refused.returncode != 0 and "createRuntime hook /bin/sh" in refused.stderr
    source = corpus.canary.parent / "volume"
    (source / "v").unlink()
    try:
        torpor(corpus.node, "restore", str(copy), "--name", "hg-granted", "--volume", "/data",
               "--allow-spec-hooks")
        assert marker.read_text() == "granted\n"
        assert (source / "v").read_text() == "v\n"      # into the accepted host path
        state = corpus.canary.parent / "state"
        assert not list(state.glob("containers/*/hg-granted/restore-grant.json"))   # taken
    finally:
        remove(corpus.node, "hg-granted")


def test_labels_containerd_and_nerdctl_act_on_stay_behind(corpus: World, tmp_path: Path) -> None:
    """containerd's restart monitor acts on containerd.io/restart.* (a binary:// log URI runs a
    host program as root), nerdctl on nerdctl/* (nerdctl rm removes its state-dir): a restored
    container carries the checkpoint's labels only where [restore] labels names them."""
    copy = tmp_path / "ck"
    shutil.copytree(corpus.directory, copy, symlinks=True)
    document = metadata_of(copy)
    document["container"]["labels"] = {
        "containerd.io/restart.status": "running",
        "containerd.io/restart.loguri": f"binary:///bin/sh?-c=touch+{corpus.canary}/pwned",
        "nerdctl/state-dir": str(corpus.canary), "io.kubernetes.container.name": "web"}
    save_metadata(copy, document)
    volume = tmp_path / "volume"
    volume.mkdir()
    try:
        torpor(corpus.node, "restore", str(copy), "--name", "h-labels", "--volume",
               f"/data={volume}")
        info = json.loads(corpus.node.ctr("containers", "info", "h-labels").stdout)
        labels = info.get("Labels") or {}
        assert not [k for k in labels if k.startswith(("containerd.io/", "nerdctl/"))], labels
        assert labels["io.kubernetes.container.name"] == "web"   # inert, the policy names it
    finally:
        remove(corpus.node, "h-labels")
    assert not (corpus.canary / "pwned").exists()
