"""Signed checkpoints with real components: node A checkpoints a container and pushes it to a
real registry, signed with `--sign` (and once unsigned); node B restores or pulls it under each
`[restore] signatures` policy. A signature that does not verify (tampered, made by a key B does
not trust, or copied from another image's digest) is refused after the index alone: the
registry's log shows no request for any of the image's layers, and B's store stays empty.
Interop with the real cosign CLI (built by install-deps.sh) and skopeo: cosign verifies what
torpor signs, torpor verifies what cosign signs, and a signature copied with `skopeo copy --all`
of the image and its `.sig` tag to another registry still verifies there.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torpor.image.store import Store
from torpor.registry import RegistryOptions, parse_reference
from torpor.registry.client import RepositoryClient
from torpor.registry.session import RegistrySession
from torpor.signing.payload import SIGNATURE_ANNOTATION, signature_tag

from .conftest import Nodes
from .support import ecosystem
from .support.containerd import Node
from .support.registry import Registry
from .support.workload import containers, kv_ask, wait_kv

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]


def run(*argv: str, check: bool = True, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    if check:
        assert result.returncode == 0, f"{' '.join(argv)}: {result.stdout}{result.stderr}"
    return result


def torpor(node: Node, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(node.bin_dir / "torpor"), *args], capture_output=True,
                            text=True, env=node.env, timeout=300)
    if check:
        assert result.returncode == 0, f"torpor {' '.join(args)}: {result.stdout}{result.stderr}"
    return result


class SigningNodes:
    """Node A (the signer) and node B (the restorer), whose `[restore]` each test sets."""

    def __init__(self, nodes: Nodes, session_dir: Path) -> None:
        self.dir = session_dir
        made = []
        for name in ("sig-a", "sig-b"):
            self.configure(name)
            made.append(nodes.start(name, own_netns=True, config=self.config(name)))
        self.a, self.b = made

    def config(self, name: str) -> Path:
        return self.dir / f"node-{name}.toml"

    def store(self, name: str) -> Path:
        return self.dir / f"{name}-store"

    def configure(self, name: str, restore: str = "", image: str = "") -> None:
        self.config(name).write_text(f'[runtime]\nstate_dir = "{self.dir}/{name}-state"\n'
                                     f'log_dir = "{self.dir}/{name}-state-logs"\n'
                                     f'[image]\nstore = "{self.store(name)}"\n{image}'
                                     f"[restore]\n{restore}")

    def policy(self, name: str, signatures: str, *trusted: Path) -> None:
        keys = ", ".join(f'"{key}"' for key in trusted)
        self.configure(name, f'signatures = "{signatures}"\ntrusted_keys = [{keys}]\n')


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("sig-keys")
    for name in ("signer", "stranger"):
        run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", str(directory / f"{name}.pem"))
        run("openssl", "pkey", "-in", str(directory / f"{name}.pem"), "-pubout",
            "-out", str(directory / f"{name}.pub"))
    return directory


@pytest.fixture(scope="module")
def sig_nodes(nodes: Nodes, session_dir: Path) -> Iterator[SigningNodes]:
    made = SigningNodes(nodes, session_dir)
    yield made
    for name in ("sig-a", "sig-b"):
        made.configure(name)


@pytest.fixture(scope="module")
def registry(session_dir: Path) -> Iterator[Registry]:
    started = Registry(session_dir / "sig-registry", "plain").start()
    yield started
    started.stop()


def repository(ref: str) -> RepositoryClient:
    parsed = parse_reference(ref)
    session = RegistrySession.for_reference(parsed, RegistryOptions(insecure=True))
    return RepositoryClient(session, parsed.repository)


def digest_of(ref: str) -> str:
    raw = run("skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}",
              f"docker://{ref}").stdout.strip()
    return raw


@pytest.fixture(scope="module")
def images(sig_nodes: SigningNodes, registry: Registry, keys: Path,
           test_image: dict[str, object]) -> Iterator[dict[str, Any]]:
    """A container checkpointed on A (left running) and pushed signed, and again unsigned;
    copies of the signed image whose signature is tampered with, and of the unsigned one
    carrying the signed one's signature, each in a repository of its own."""
    a = sig_nodes.a
    host = registry.host
    refs = {"signed": f"{host}/team/signed:ckpt-1", "unsigned": f"{host}/team/unsigned:ckpt-1",
            "tampered": f"{host}/team/tampered:ckpt-1", "moved": f"{host}/team/moved:ckpt-1",
            "foreign": f"{host}/team/foreign:ckpt-1"}
    a.ctr("run", "-d", *SHIM, str(test_image["name"]), "sig-src", "sh", "-c",
          "exec kvserver 7000")
    try:
        wait_kv(a, "sig-src")
        assert kv_ask(a, "sig-src", "SET who signed-state") == "OK"
        out = json.loads(torpor(a, "checkpoint", "sig-src", "-t", refs["signed"], "--push",
                                "--leave-running", "--json", "--sign",
                                str(keys / "signer.pem")).stdout)
        torpor(a, "checkpoint", "sig-src", "-t", refs["unsigned"], "--push", "--leave-running")
    finally:
        a.ctr("tasks", "delete", "--force", "sig-src", check=False)
        a.ctr("containers", "rm", "sig-src", check=False)
    digests = {name: digest_of(ref) for name, ref in refs.items() if name in ("signed", "unsigned")}
    assert out["digest"] == digests["signed"]
    torpor(a, "push", refs["signed"], refs["tampered"])       # the same image, same digest
    torpor(a, "push", refs["signed"], refs["foreign"])
    torpor(a, "push", refs["unsigned"], refs["moved"])
    signed_repo = repository(refs["signed"])
    signature = signed_repo.get_manifest(signature_tag(digests["signed"]), 1 << 20)
    manifest = json.loads(signature.body)
    tampered, moved, foreign = (repository(refs[name]) for name in ("tampered", "moved", "foreign"))
    for repo in (tampered, moved, foreign):   # the `.sig` image's config and payload, mounted
        for blob in (manifest["config"], manifest["layers"][0]):
            assert repo.start_upload(blob["digest"], "team/signed").mounted
    # foreign: the genuine signature (for a node that does not trust its key)
    foreign.put_manifest(signature_tag(digests["signed"]), signature.body, signature.media_type)
    # moved: the signed image's genuine signature, under the unsigned image's digest
    moved.put_manifest(signature_tag(digests["unsigned"]), signature.body, signature.media_type)
    # tampered: one bit of the DER signature flipped
    layer = manifest["layers"][0]
    der = bytearray(base64.b64decode(layer["annotations"][SIGNATURE_ANNOTATION]))
    der[-3] ^= 0x01
    layer["annotations"][SIGNATURE_ANNOTATION] = base64.b64encode(bytes(der)).decode()
    tampered.put_manifest(signature_tag(digests["signed"]), json.dumps(manifest).encode(),
                          signature.media_type)
    for repo in (signed_repo, tampered, moved, foreign):
        repo.session.close()
    layers = [layer["digest"] for name in ("signed", "unsigned") for layer in
              json.loads(torpor(a, "inspect", refs[name], "--json").stdout)["layers"]]
    yield {"refs": refs, "digests": digests, "layers": layers}


def assert_nothing_downloaded(sig_nodes: SigningNodes, registry: Registry, log_before: int,
                              layers: list[str], ref: str) -> None:
    """No request for a layer since `log_before`; `ref` is not in B's store, no scratch left."""
    requests = registry.log_text()[log_before:]
    assert "/manifests/" in requests   # the log does show the requests made
    assert not [d for d in layers if f"/blobs/{d}" in requests]
    store = sig_nodes.store("sig-b")
    assert not Store(str(store)).has(ref)
    assert not list(store.glob("scratch/*"))


def test_a_signed_checkpoint_restores_where_its_key_is_trusted(
        sig_nodes: SigningNodes, images: dict[str, Any], keys: Path) -> None:
    b = sig_nodes.b
    sig_nodes.policy("sig-b", "required", keys / "stranger.pub", keys / "signer.pub")
    report = json.loads(torpor(b, "inspect", images["refs"]["signed"], "--json").stdout)
    verdict = report["signatures"]
    assert verdict["policy"] == "required" and not verdict["made_here"]
    assert len(verdict["signatures"]) == 1
    assert verdict["signatures"][0]["verified_by"].startswith(f"{keys / 'signer.pub'} (key ")
    with containers(b) as on_b:
        on_b.append("sig-restored")
        out = torpor(b, "restore", images["refs"]["signed"], "--name", "sig-restored")
        assert "verified by " + str(keys / "signer.pub") in out.stderr + out.stdout
        assert kv_ask(b, "sig-restored", "GET who") == "signed-state"


@pytest.mark.parametrize("case", ["tampered", "wrong-key", "another-digest"])
def test_a_signature_that_does_not_verify_is_refused_before_download(
        sig_nodes: SigningNodes, registry: Registry, images: dict[str, Any], keys: Path,
        case: str, tmp_path: Path) -> None:
    b = sig_nodes.b
    trusted = keys / ("stranger.pub" if case == "wrong-key" else "signer.pub")
    sig_nodes.policy("sig-b", "if-present", trusted)
    ref = images["refs"][{"tampered": "tampered", "wrong-key": "foreign",
                          "another-digest": "moved"}[case]]
    before = len(registry.log_text())
    with containers(b) as on_b:    # removed, should it be restored
        on_b.append(f"sig-{case}")
        refused = torpor(b, "restore", ref, "--name", f"sig-{case}", check=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "none verifies" in refused.stderr
    expected = {"tampered": f"it verifies with none of the trusted keys ({trusted}",
                "wrong-key": f"it verifies with none of the trusted keys ({trusted}",
                "another-digest": f"it signs another image, {images['digests']['signed']}"}
    assert expected[case] in refused.stderr
    assert "trusted_keys" in refused.stderr   # what to do
    pulled = torpor(b, "pull", ref, check=False)
    assert pulled.returncode == 1 and "none verifies" in pulled.stderr
    archived = torpor(b, "kube", "archive", ref, "-o", str(tmp_path / "kubelet.tar"), check=False)
    assert archived.returncode == 1 and "none verifies" in archived.stderr
    assert not (tmp_path / "kubelet.tar").exists()
    assert_nothing_downloaded(sig_nodes, registry, before, images["layers"], ref)
    assert f"sig-{case}" not in b.ctr("containers", "ls", "-q").stdout.split()


def test_required_refuses_unsigned_images_but_not_this_nodes_own(
        sig_nodes: SigningNodes, registry: Registry, images: dict[str, Any], keys: Path) -> None:
    b, a = sig_nodes.b, sig_nodes.a
    unsigned = images["refs"]["unsigned"]
    sig_nodes.policy("sig-b", "required", keys / "signer.pub")
    before = len(registry.log_text())
    with containers(b) as on_b:
        on_b.append("sig-unsigned")
        refused = torpor(b, "restore", unsigned, "--name", "sig-unsigned", check=False)
    assert refused.returncode == 1, refused.stderr
    assert f"({images['digests']['unsigned']}) is not signed" in refused.stderr
    assert '[restore] signatures is "required"' in refused.stderr
    assert "--sign KEY" in refused.stderr
    assert_nothing_downloaded(sig_nodes, registry, before, images["layers"], unsigned)
    # if-present: unsigned is fine
    sig_nodes.policy("sig-b", "if-present", keys / "signer.pub")
    torpor(b, "pull", unsigned)
    # A made it: restorable there from the registry (its local copy removed) under
    # "required", with no trusted key at all
    torpor(a, "rm", unsigned)
    sig_nodes.policy("sig-a", "required")
    try:
        with containers(a) as on_a:
            on_a.append("sig-own")
            out = torpor(a, "restore", unsigned, "--name", "sig-own")
            assert "was made by this node" in out.stdout + out.stderr
            assert kv_ask(a, "sig-own", "GET who") == "signed-state"
    finally:
        sig_nodes.configure("sig-a")


def test_the_nodes_signing_key_signs_what_it_pushes(
        sig_nodes: SigningNodes, registry: Registry, images: dict[str, Any], keys: Path,
        tmp_path: Path) -> None:
    ref = f"{registry.host}/team/by-node:ckpt-1"
    kube_ref = f"{registry.host}/team/for-kubelet:ckpt-1"
    sig_nodes.configure("sig-a", image=f'signing_key = "{keys / "signer.pem"}"\n')
    try:
        out = torpor(sig_nodes.a, "push", images["refs"]["signed"], ref)
        # the image kubelet restores from, made here: signed too (cosign checks it)
        torpor(sig_nodes.a, "kube", "image", images["refs"]["signed"], "-t", kube_ref)
    finally:
        sig_nodes.configure("sig-a")
    cosign(tmp_path, "verify", "--key", str(keys / "signer.pub"), "--insecure-ignore-tlog=true",
           *INSECURE, f"{kube_ref.rsplit(':', 1)[0]}@{digest_of(kube_ref)}")
    tag = signature_tag(images["digests"]["signed"])
    assert f"signed in {registry.host}/team/by-node:{tag}" in out.stdout
    sig_nodes.policy("sig-b", "required", keys / "signer.pub")
    pulled = torpor(sig_nodes.b, "pull", ref, "-o", str(tmp_path / "layout"))
    assert f"verified by {keys / 'signer.pub'}" in pulled.stderr


def test_each_key_signs_once(sig_nodes: SigningNodes, registry: Registry,
                             images: dict[str, Any], keys: Path, tmp_path: Path) -> None:
    """A second key adds its signature beside the first; signing again with a key replaces
    that key's own."""
    ref = f"{registry.host}/team/twice:ckpt-1"
    digest = images["digests"]["signed"]
    for key in ("signer", "stranger", "signer"):
        torpor(sig_nodes.a, "push", images["refs"]["signed"], ref, "--sign",
               str(keys / f"{key}.pem"))
    repo = repository(ref)
    try:
        layers = json.loads(repo.get_manifest(signature_tag(digest), 1 << 20).body)["layers"]
    finally:
        repo.session.close()
    assert len(layers) == 2 and layers[0]["digest"] == layers[1]["digest"]   # one payload
    for key in ("signer", "stranger"):
        sig_nodes.policy("sig-b", "required", keys / f"{key}.pub")
        out = torpor(sig_nodes.b, "pull", ref, "-o", str(tmp_path / key))
        assert f"verified by {keys / key}.pub" in out.stderr
        cosign(tmp_path, "verify", "--key", str(keys / f"{key}.pub"),
               "--insecure-ignore-tlog=true", *INSECURE, f"{ref.rsplit(':', 1)[0]}@{digest}")


def test_off_ignores_signatures(sig_nodes: SigningNodes, images: dict[str, Any],
                                tmp_path: Path) -> None:
    sig_nodes.policy("sig-b", "off")
    out = torpor(sig_nodes.b, "pull", images["refs"]["tampered"], "-o", str(tmp_path / "l"))
    assert "signatures not checked" in out.stdout + out.stderr
    assert (tmp_path / "l" / "index.json").exists()


# cosign and skopeo ---------------------------------------------------------------------------


def cosign(home: Path, *args: str, check: bool = True,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The cosign CLI. `verify` is given an empty trusted root: with --key and no transparency
    log it needs none, and it would otherwise ask sigstore's TUF repository on the network."""
    environment = {**os.environ, "HOME": str(home), "COSIGN_PASSWORD": "test-password",
                   "SIGSTORE_NO_CACHE": "1", "TUF_ROOT": str(home / "tuf"), **(env or {})}
    if args[0] == "verify":
        root = home / "empty-trusted-root.json"
        root.write_text('{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1"}')
        args = (args[0], "--trusted-root", str(root), *args[1:])
    return run(str(ecosystem.tool("cosign")), *args, env=environment, cwd=home, check=check)


INSECURE = ["--allow-insecure-registry", "--allow-http-registry"]


def test_cosign_verifies_what_torpor_signs(images: dict[str, Any], keys: Path,
                                           tmp_path: Path) -> None:
    ref = images["refs"]["signed"].rsplit(":", 1)[0] + "@" + images["digests"]["signed"]
    ok = cosign(tmp_path, "verify", "--key", str(keys / "signer.pub"),
                "--insecure-ignore-tlog=true", *INSECURE, ref)
    claims = json.loads(ok.stdout)
    assert claims[0]["critical"]["image"]["docker-manifest-digest"] == images["digests"]["signed"]
    wrong = cosign(tmp_path, "verify", "--key", str(keys / "stranger.pub"),
                   "--insecure-ignore-tlog=true", *INSECURE, ref, check=False)
    assert wrong.returncode != 0
    tampered = images["refs"]["tampered"].rsplit(":", 1)[0] + "@" + images["digests"]["signed"]
    bad = cosign(tmp_path, "verify", "--key", str(keys / "signer.pub"),
                 "--insecure-ignore-tlog=true", *INSECURE, tampered, check=False)
    assert bad.returncode != 0


def test_torpor_verifies_what_cosign_signs(sig_nodes: SigningNodes, registry: Registry,
                                           images: dict[str, Any], tmp_path: Path) -> None:
    b, a = sig_nodes.b, sig_nodes.a
    cosign(tmp_path, "generate-key-pair")
    ref = f"{registry.host}/team/by-cosign:ckpt-1"
    torpor(a, "push", images["refs"]["unsigned"], ref)
    pinned = ref.rsplit(":", 1)[0] + "@" + images["digests"]["unsigned"]
    cosign(tmp_path, "sign", "--key", str(tmp_path / "cosign.key"), "--tlog-upload=false",
           "--yes", *INSECURE, pinned)
    sig_nodes.policy("sig-b", "required", tmp_path / "cosign.pub")
    out = torpor(b, "pull", ref, "-o", str(tmp_path / "layout"))
    assert f"verified by {tmp_path / 'cosign.pub'}" in out.stdout + out.stderr
    report = json.loads(torpor(b, "inspect", ref, "--json").stdout)["signatures"]
    assert report["verified_by"] and len(report["signatures"]) == 1
    # signed as an OCI 1.1 referrer only (docker-registry 2.8 has no referrers API: cosign
    # keeps an index of them under the tag sha256-<hex>)
    referred = f"{registry.host}/team/by-cosign-referrer:ckpt-1"
    torpor(a, "push", images["refs"]["unsigned"], referred)
    cosign(tmp_path, "sign", "--key", str(tmp_path / "cosign.key"), "--tlog-upload=false",
           "--yes", "--registry-referrers-mode=oci-1-1", *INSECURE,
           referred.rsplit(":", 1)[0] + "@" + images["digests"]["unsigned"],
           env={"COSIGN_EXPERIMENTAL": "1"})
    tags = run("skopeo", "list-tags", "--tls-verify=false",
               f"docker://{referred.rsplit(':', 1)[0]}").stdout
    assert signature_tag(images["digests"]["unsigned"]) not in tags
    out = torpor(b, "pull", referred, "-o", str(tmp_path / "referred"))
    assert f"verified by {tmp_path / 'cosign.pub'}" in out.stdout + out.stderr
    # torpor signs with cosign's own cosign.key (its password in COSIGN_PASSWORD)
    by_key = f"{registry.host}/team/torpor-cosign-key:ckpt-1"
    pushed = subprocess.run([str(a.bin_dir / "torpor"), "push", images["refs"]["signed"], by_key,
                             "--sign", str(tmp_path / "cosign.key")], capture_output=True,
                            text=True, timeout=300,
                            env={**a.env, "COSIGN_PASSWORD": "test-password"})
    assert pushed.returncode == 0 and "signed in" in pushed.stdout, pushed.stderr
    cosign(tmp_path, "verify", "--key", str(tmp_path / "cosign.pub"),
           "--insecure-ignore-tlog=true", *INSECURE,
           by_key.rsplit(":", 1)[0] + "@" + images["digests"]["signed"])


@pytest.fixture
def second_registry(session_dir: Path, request: pytest.FixtureRequest) -> Iterator[Registry]:
    started = Registry(session_dir / "sig-registries", request.node.name[-30:]).start()
    yield started
    started.stop()


def copy(source: str, target: str) -> None:
    run("skopeo", "copy", "--all", "--src-tls-verify=false", "--dest-tls-verify=false",
        f"docker://{source}", f"docker://{target}")


def test_a_signature_survives_cosign_copy_to_another_registry(
        sig_nodes: SigningNodes, images: dict[str, Any], keys: Path, second_registry: Registry,
        tmp_path: Path) -> None:
    """`cosign copy` takes the image and its signatures, the index byte for byte."""
    digest, target = images["digests"]["signed"], f"{second_registry.host}/mirror/web:ckpt-1"
    copied = cosign(tmp_path, "copy", *INSECURE, images["refs"]["signed"], target, check=False)
    if copied.returncode and "MANIFEST_BLOB_UNKNOWN" in copied.stderr:
        # cosign 2.6.5 writes an index and its manifests concurrently, and now and then the
        # index first (the registry refuses it: a child not there yet); a copy is idempotent,
        # so a user runs it again
        copied = cosign(tmp_path, "copy", *INSECURE, images["refs"]["signed"], target,
                        check=False)
    assert copied.returncode == 0, copied.stdout + copied.stderr
    assert digest_of(target) == digest
    sig_nodes.policy("sig-b", "required", keys / "signer.pub")
    out = torpor(sig_nodes.b, "pull", target, "-o", str(tmp_path / "mirror"))
    assert f"verified by {keys / 'signer.pub'}" in out.stdout + out.stderr
    cosign(tmp_path, "verify", "--key", str(keys / "signer.pub"), "--insecure-ignore-tlog=true",
           *INSECURE, f"{second_registry.host}/mirror/web@{digest}")


def test_a_signature_copied_by_skopeo_verifies_where_the_digest_is_kept(
        sig_nodes: SigningNodes, images: dict[str, Any], keys: Path, second_registry: Registry,
        tmp_path: Path) -> None:
    """skopeo copies the `.sig` tag byte for byte (a plain OCI manifest, its digest kept), and
    the signature verifies beside a copy of the image with the same digest. skopeo 1.9.3 itself
    rewrites the checkpoint's index (it drops the OCI 1.1 `artifactType` of the state
    manifest's descriptor, and `--preserve-digests` refuses), so an image it copied has another
    digest, which the signature does not cover: that copy counts as unsigned."""
    source, digest = images["refs"]["signed"], images["digests"]["signed"]
    host, tag = second_registry.host, signature_tag(digest)
    repository_of = source.rsplit(":", 1)[0]
    sig_nodes.policy("sig-b", "required", keys / "signer.pub")
    # the image by torpor (digest kept), its signature by skopeo
    torpor(sig_nodes.a, "push", source, f"{host}/mirror/kept:ckpt-1")
    copy(f"{repository_of}:{tag}", f"{host}/mirror/kept:{tag}")
    assert digest_of(f"{host}/mirror/kept:ckpt-1") == digest
    assert digest_of(f"{host}/mirror/kept:{tag}") == digest_of(f"{repository_of}:{tag}")
    out = torpor(sig_nodes.b, "pull", f"{host}/mirror/kept:ckpt-1", "-o", str(tmp_path / "kept"))
    assert f"verified by {keys / 'signer.pub'}" in out.stdout + out.stderr
    cosign(tmp_path, "verify", "--key", str(keys / "signer.pub"), "--insecure-ignore-tlog=true",
           *INSECURE, f"{host}/mirror/kept@{digest}")
    # both by skopeo: a rewritten index, not what was signed
    copy(source, f"{host}/mirror/rewritten:ckpt-1")
    copy(f"{repository_of}:{tag}", f"{host}/mirror/rewritten:{tag}")
    rewritten = digest_of(f"{host}/mirror/rewritten:ckpt-1")
    assert rewritten != digest
    refused = torpor(sig_nodes.b, "pull", f"{host}/mirror/rewritten:ckpt-1", check=False)
    assert refused.returncode == 1 and f"({rewritten}) is not signed" in refused.stderr
