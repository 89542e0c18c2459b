"""Encrypted checkpoints with real components: checkpoint on node A encrypted for two recipients
and pushed to a real registry; the registry holds no plaintext of the memory, volume or
read-write layers, nor the spec's environment; node B refuses it without a key and with a wrong
one (nothing left behind), restores it with either recipient's key, and `torpor pull
--decryption-key` leaves a decrypted copy any node restores. skopeo interop on a real torpor
checkpoint image, both ways as far as skopeo 1.9.3 goes:
  - torpor encrypts, `skopeo copy --all --decryption-key` decrypts the whole checkpoint image
    (state and runnable), and torpor restores what skopeo wrote;
  - `skopeo copy --encryption-key` encrypts the runnable image of a real (plain) torpor
    checkpoint (skopeo knows only OCI and Docker layer types, not torpor's state layers), and
    torpor decrypts every layer to the original blobs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torpor.formats.oci import Descriptor
from torpor.image import ocicrypt
from torpor.image.encryption_keys import load_decryption_key
from torpor.registry.layout import Layout

from .conftest import Nodes
from .support.containerd import Node
from .support.registry import Registry
from .support.workload import containers, kv_ask, wait_kv

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]
SECRET_ENV = "API_TOKEN=hunter2-in-the-spec"
KEYS = {"ec": ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        "rsa": ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        "other": ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"]}


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, f"{' '.join(argv)}: {result.stdout}{result.stderr}"
    return result


def torpor(node: Node, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(node.bin_dir / "torpor"), *args], capture_output=True,
                            text=True, env=node.env, timeout=300)
    if check:
        assert result.returncode == 0, f"torpor {' '.join(args)}: {result.stdout}{result.stderr}"
    return result


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("enc-keys")
    for kind, options in KEYS.items():
        run("openssl", "genpkey", *options, "-out", str(directory / f"{kind}.pem"))
        run("openssl", "pkey", "-in", str(directory / f"{kind}.pem"), "-pubout",
            "-out", str(directory / f"{kind}.pub"))
    return directory


@pytest.fixture(scope="module")
def enc_nodes(nodes: Nodes, session_dir: Path) -> tuple[Node, Node]:
    made = []
    for name in ("enc-a", "enc-b"):
        config = session_dir / f"node-{name}.toml"
        config.write_text(f'[runtime]\nstate_dir = "{session_dir}/{name}-state"\n'
                          f'log_dir = "{session_dir}/{name}-state-logs"\n'
                          f'[image]\nstore = "{session_dir}/{name}-store"\n')
        made.append(nodes.start(name, own_netns=True, config=config))
    return made[0], made[1]


@pytest.fixture(scope="module")
def registry(session_dir: Path) -> Iterator[Registry]:
    started = Registry(session_dir / "enc-registry", "plain").start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def pushed(enc_nodes: tuple[Node, Node], registry: Registry, keys: Path, session_dir: Path,
           test_image: dict[str, object]) -> Iterator[dict[str, Any]]:
    """A container with a volume, a rootfs change and a secret in its environment and memory,
    checkpointed on A, encrypted for the EC and the RSA key, pushed."""
    a, _ = enc_nodes
    volume = session_dir / "enc-volume"
    volume.mkdir()
    ref = f"{registry.host}/team/enc:ckpt-1"
    a.ctr("run", "-d", *SHIM, "--env", SECRET_ENV, "--mount",
          f"type=bind,src={volume},dst=/data,options=rbind:rw", str(test_image["name"]), "enc",
          "sh", "-c", "echo from-the-volume > /data/v; echo rootfs-note > /root/note; "
          "exec kvserver 7000")
    wait_kv(a, "enc")
    assert kv_ask(a, "enc", "SET secret memory-only-value") == "OK"
    out = torpor(a, "checkpoint", "enc", "-t", ref, "--push", "--json",
                 "--encrypt-recipient", f"jwe:{keys / 'ec.pub'}",
                 "--encrypt-recipient", f"jwe:{keys / 'rsa.pub'}")
    yield {"ref": ref, "result": json.loads(out.stdout), "volume": volume}
    a.ctr("tasks", "delete", "--force", "enc", check=False)
    a.ctr("containers", "rm", "enc", check=False)


def manifests_of(registry: Registry, ref: str, tmp: Path) -> dict[str, dict[str, Any]]:
    raw = json.loads(run("skopeo", "inspect", "--tls-verify=false", "--raw",
                         f"docker://{ref}").stdout)
    out = {}
    for entry in raw["manifests"]:
        role = entry["annotations"]["io.torpor.checkpoint.role"]
        out[role] = json.loads(run("skopeo", "inspect", "--tls-verify=false", "--raw",
                                   f"docker://{ref.rsplit(':', 1)[0]}@{entry['digest']}").stdout)
    return out


def test_the_registry_holds_no_plaintext_state(registry: Registry, pushed: dict[str, Any],
                                               tmp_path: Path) -> None:
    manifests = manifests_of(registry, pushed["ref"], tmp_path)
    state, runnable = manifests["state"], manifests["runnable"]
    kinds = [layer["mediaType"] for layer in state["layers"]]
    assert kinds[0] == "application/vnd.torpor.checkpoint.metadata.v1+json+encrypted"
    assert all(kind.endswith("+encrypted") for kind in kinds)
    assert any("pack.v1+encrypted" in kind for kind in kinds)          # CRIU's images, in chunks
    assert any("chunk-index.v1+json+zstd+encrypted" in kind for kind in kinds)
    assert any("volumes.v1.tar+zstd+encrypted" in kind for kind in kinds)
    assert runnable["layers"][-1]["mediaType"].endswith("tar+zstd+encrypted")   # rootfs diff
    assert not any(layer["mediaType"].endswith("+encrypted") for layer in runnable["layers"][:-1])
    config = registry.blob_data(state["config"]["digest"]).read_bytes()
    clear = json.loads(config)
    assert clear["container"]["spec"] == {} and clear["state"]["processes"] == []
    assert clear["node"]["criu_version"] and clear["files"]   # what a preflight needs
    for document in (config, json.dumps(manifests).encode()):
        assert b"hunter2" not in document and b"kvserver" not in document
    for layer in [*state["layers"], runnable["layers"][-1]]:
        blob = registry.blob_data(layer["digest"]).read_bytes()
        assert not blob.startswith(b"\x28\xb5\x2f\xfd")   # not a zstd frame: ciphertext
        assert b"hunter2" not in blob and b"memory-only-value" not in blob


def test_no_key_and_a_wrong_key_are_refused_before_download(
        enc_nodes: tuple[Node, Node], pushed: dict[str, Any], keys: Path,
        session_dir: Path) -> None:
    _, b = enc_nodes
    missing = torpor(b, "restore", pushed["ref"], "--name", "enc-nokey", check=False)
    assert missing.returncode == 1, missing.stderr
    assert "is encrypted and no --decryption-key was given" in missing.stderr
    assert "ECDH-ES+A256KW P-256" in missing.stderr and "RSA-OAEP" in missing.stderr
    wrong = torpor(b, "restore", pushed["ref"], "--name", "enc-wrong",
                   "--decryption-key", str(keys / "other.pem"), check=False)
    assert wrong.returncode == 1
    assert "encrypted for other keys" in wrong.stderr and "Traceback" not in wrong.stderr
    listed = b.ctr("containers", "ls", "-q").stdout.split()
    assert "enc-nokey" not in listed and "enc-wrong" not in listed
    store = session_dir / "enc-b-store"
    assert not list(store.glob("images/*/layout/blobs/sha256/*"))  # nothing downloaded
    assert not list(store.glob("scratch/*"))


@pytest.mark.parametrize("key", ["ec", "rsa"])
def test_either_recipient_restores_it(enc_nodes: tuple[Node, Node], pushed: dict[str, Any],
                                      keys: Path, tmp_path: Path, session_dir: Path,
                                      key: str) -> None:
    _, b = enc_nodes
    name = f"enc-{key}"
    volume = tmp_path / "volume"
    volume.mkdir()
    with containers(b) as on_b:
        on_b.append(name)
        torpor(b, "restore", pushed["ref"], "--name", name, "--decryption-key",
               str(keys / f"{key}.pem"), "--volume", f"/data={volume}")
        assert kv_ask(b, name, "GET secret") == "memory-only-value"
        assert (volume / "v").read_text() == "from-the-volume\n"
        note = b.ctr("tasks", "exec", "--exec-id", "note", name, "cat", "/root/note").stdout
        assert note == "rootfs-note\n"
    # the local copy stays encrypted; no decrypted blob is left in scratch space
    store = session_dir / "enc-b-store"
    assert not list(store.glob("scratch/*"))
    for blob in store.glob("images/*/layout/blobs/sha256/*"):
        data = blob.read_bytes()
        assert b"memory-only-value" not in data and b"hunter2" not in data


def test_pull_with_a_key_leaves_a_decrypted_copy(enc_nodes: tuple[Node, Node],
                                                 pushed: dict[str, Any], keys: Path,
                                                 tmp_path: Path) -> None:
    a, b = enc_nodes
    layout = tmp_path / "plain"
    torpor(b, "pull", pushed["ref"], "-o", str(layout), "--decryption-key",
           str(keys / "rsa.pem"))
    index = Layout(layout)
    for path in (layout / "blobs" / "sha256").iterdir():
        assert not json.dumps(str(path)).endswith("+encrypted")
    report = json.loads(torpor(b, "inspect", str(layout), "--json").stdout)
    assert report["encrypted"] is False and report["sealed"] is False
    assert any("bind mount of host path" in g["what"] and g["allowed_by"] is None
               for g in report["grants"])   # what a restore would need granted
    sealed = json.loads(torpor(b, "inspect", pushed["ref"], "--json").stdout)
    assert sealed["encrypted"] and sealed["sealed"] and sealed["grants"] is None
    opened = json.loads(torpor(b, "inspect", pushed["ref"], "--json", "--decryption-key",
                               str(keys / "ec.pem")).stdout)
    assert opened["processes"] and not opened["sealed"]
    assert index.index_entries()
    with containers(a) as on_a:
        on_a.append("enc-pulled")
        torpor(a, "restore", str(layout), "--name", "enc-pulled", "--volume",
               f"/data={tmp_path}")
        assert kv_ask(a, "enc-pulled", "GET secret") == "memory-only-value"


def test_skopeo_decrypts_a_torpor_encrypted_checkpoint(enc_nodes: tuple[Node, Node],
                                                       pushed: dict[str, Any], keys: Path,
                                                       tmp_path: Path) -> None:
    """torpor encrypts, skopeo 1.9.3 decrypts every layer (state and runnable) with --all, and
    torpor restores from what skopeo wrote."""
    _, b = enc_nodes
    out = tmp_path / "skopeo-plain"
    run("skopeo", "copy", "--all", "--src-tls-verify=false", "--decryption-key",
        str(keys / "ec.pem"), f"docker://{pushed['ref']}", f"oci:{out}:ckpt")
    layout = Layout(out)
    documents = [json.loads(data) for path in (out / "blobs" / "sha256").iterdir()
                 if (data := path.read_bytes())[:1] == b"{"]
    layers = [layer for doc in documents for layer in doc.get("layers", [])]
    assert layers and not any(layer["mediaType"].endswith("+encrypted") for layer in layers)
    assert any(layer["mediaType"].endswith("pack.v1") for layer in layers)
    for layer in layers:   # each decrypted blob is there, whole
        assert layout.holds_intact(Descriptor(layer["mediaType"], layer["digest"], layer["size"]))
    volume = tmp_path / "volume"
    volume.mkdir()
    with containers(b) as on_b:
        on_b.append("enc-skopeo")
        torpor(b, "restore", str(out), "--name", "enc-skopeo", "--volume", f"/data={volume}")
        assert kv_ask(b, "enc-skopeo", "GET secret") == "memory-only-value"


def test_torpor_decrypts_what_skopeo_encrypts_of_a_real_checkpoint(
        enc_nodes: tuple[Node, Node], registry: Registry, keys: Path, tmp_path: Path,
        test_image: dict[str, object]) -> None:
    """skopeo encrypts the runnable image of a plain torpor checkpoint (base layers and the
    read-write layer); torpor decrypts each layer to the blob the plain image holds."""
    a, _ = enc_nodes
    ref = f"{registry.host}/team/plain-for-skopeo:ckpt-1"
    with containers(a) as on_a:
        on_a.append("skopeo-src")
        a.ctr("run", "-d", *SHIM, str(test_image["name"]), "skopeo-src", "sh", "-c",
              "echo changed > /root/changed; exec kvserver 7000")
        wait_kv(a, "skopeo-src")
        torpor(a, "checkpoint", "skopeo-src", "-t", ref, "--push", "--leave-running")
    plain = json.loads(run("skopeo", "inspect", "--tls-verify=false", "--raw",
                           f"docker://{ref}").stdout)
    runnable_entry = next(m for m in plain["manifests"]
                          if m["annotations"]["io.torpor.checkpoint.role"] == "runnable")
    plain_runnable = json.loads(run("skopeo", "inspect", "--tls-verify=false", "--raw",
                                    f"docker://{ref.rsplit(':', 1)[0]}@{runnable_entry['digest']}"
                                    ).stdout)
    out = tmp_path / "skopeo-enc"
    run("skopeo", "copy", "--src-tls-verify=false", "--encryption-key",
        f"jwe:{keys / 'rsa.pub'}", f"docker://{ref}", f"oci:{out}:enc")
    index = json.loads((out / "index.json").read_text())
    manifest = json.loads((out / "blobs" / "sha256" /
                           index["manifests"][0]["digest"].split(":")[1]).read_bytes())
    encrypted = manifest["layers"]
    assert len(encrypted) == len(plain_runnable["layers"]) >= 2
    private = load_decryption_key(str(keys / "rsa.pem"))
    for layer, original in zip(encrypted, plain_runnable["layers"], strict=True):
        assert layer["mediaType"] == original["mediaType"] + "+encrypted"
        src = out / "blobs" / "sha256" / layer["digest"].split(":")[1]
        result = ocicrypt.decrypt_blob(str(src), str(tmp_path / "plain.blob"), layer, [private])
        assert (result.digest, result.size) == (original["digest"], original["size"])
    shutil.rmtree(out)
