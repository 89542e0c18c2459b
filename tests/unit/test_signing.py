"""Signed checkpoints without a registry: the simple-signing payload, the `.sig` manifest, PEM
keys, each signature's verdict and the node's policy values."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from torpor.config import Config
from torpor.errors import ConfigError, FormatError
from torpor.formats.digests import sha256_digest
from torpor.signing import Policy, load_signing_key, load_trusted_key, own
from torpor.signing.payload import (
    PAYLOAD_MEDIA_TYPE,
    SIGNATURE_ANNOTATION,
    SignatureLayer,
    make_payload,
    signature_layers,
    signature_manifest,
    signature_tag,
    signed_digest,
)
from torpor.signing.verify import status_of

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def write_key(directory: Path, name: str, curve: ec.EllipticCurve | None = None,
              fmt: serialization.PrivateFormat = serialization.PrivateFormat.PKCS8,
              password: bytes | None = None) -> tuple[Path, Path]:
    key = ec.generate_private_key(curve or ec.SECP256R1())
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password
        else serialization.NoEncryption())
    private, public = directory / f"{name}.pem", directory / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, fmt, encryption))
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def test_the_payload_is_cosigns_simple_signing_document() -> None:
    payload = make_payload("127.0.0.1:5000/team/web", DIGEST)
    assert payload == (b'{"critical":{"identity":{"docker-reference":"127.0.0.1:5000/team/web"},'
                       b'"image":{"docker-manifest-digest":"' + DIGEST.encode() + b'"},'
                       b'"type":"cosign container image signature"},"optional":null}')
    assert signed_digest(payload) == DIGEST
    assert signature_tag(DIGEST) == "sha256-" + "ab" * 32 + ".sig"


@pytest.mark.parametrize("payload", [
    b"not json", b"{}", b'{"critical":{"type":"cosign container image signature"}}',
    b'{"critical":{"identity":{},"image":{"docker-manifest-digest":"sha256:00"},'
    b'"type":"cosign container image signature"}}',
    json.dumps({"critical": {"image": {"docker-manifest-digest": DIGEST},
                             "type": "atomic container signature"}}).encode(),
    b" " * (65 << 10)])
def test_other_payloads_are_refused_in_words(payload: bytes) -> None:
    with pytest.raises(FormatError, match="signature payload"):
        signed_digest(payload)


def test_the_signature_manifest_holds_one_layer_per_signature() -> None:
    first = SignatureLayer(make_payload("r/a", DIGEST), "c2ln")
    kept = {"mediaType": PAYLOAD_MEDIA_TYPE, "digest": OTHER, "size": 3,
            "annotations": {SIGNATURE_ANNOTATION: "b3RoZXI=", "dev.sigstore.cosign/bundle": "{}"}}
    config, body = signature_manifest([first], [kept])
    manifest = json.loads(body)
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["config"] == {"mediaType": "application/vnd.oci.image.config.v1+json",
                                  "size": len(config), "digest": sha256_digest(config)}
    assert manifest["layers"][0] == kept               # another signer's, unchanged, first
    assert manifest["layers"][1] == {"mediaType": PAYLOAD_MEDIA_TYPE, "size": len(first.payload),
                                     "digest": first.digest,
                                     "annotations": {SIGNATURE_ANNOTATION: "c2ln"}}
    assert json.loads(config)["rootfs"]["diff_ids"] == [OTHER, first.digest]
    assert [sig for _, sig in signature_layers(manifest)] == ["b3RoZXI=", "c2ln"]


def test_a_signature_verifies_with_its_key_only(tmp_path: Path) -> None:
    private, public = write_key(tmp_path, "signer")
    _, stranger = write_key(tmp_path, "stranger")
    key, trusted, other = load_signing_key(str(private)), load_trusted_key(str(public)), \
        load_trusted_key(str(stranger))
    assert key.id == trusted.id != other.id
    payload = make_payload("r/a", DIGEST)
    layer = SignatureLayer(payload, base64.b64encode(key.sign(payload)).decode())
    ok = status_of(layer, DIGEST, [other, trusted])
    assert ok.verified_by == trusted.describe() and ok.problem is None
    wrong = status_of(layer, DIGEST, [other])
    assert wrong.verified_by is None and "verifies with none of the trusted keys" in str(wrong.problem)
    assert str(stranger) in str(wrong.problem)
    moved = status_of(layer, OTHER, [trusted])   # a signature over another image, copied here
    assert moved.verified_by is None and f"another image, {DIGEST}" in str(moved.problem)
    tampered = SignatureLayer(payload.replace(b"r/a", b"r/b"), layer.signature_b64)
    assert status_of(tampered, DIGEST, [trusted]).verified_by is None
    garbled = SignatureLayer(payload, "not base64!")
    assert "not base64" in str(status_of(garbled, DIGEST, [trusted]).problem)
    assert "no [restore] trusted_keys" in str(status_of(layer, DIGEST, []).problem)


def test_sec1_and_encrypted_pkcs8_keys_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sec1, _ = write_key(tmp_path, "sec1", fmt=serialization.PrivateFormat.TraditionalOpenSSL)
    assert load_signing_key(str(sec1)).id
    locked, _ = write_key(tmp_path, "locked", password=b"hunter2")
    monkeypatch.delenv("COSIGN_PASSWORD", raising=False)
    with pytest.raises(ConfigError, match="is encrypted"):
        load_signing_key(str(locked))
    monkeypatch.setenv("COSIGN_PASSWORD", "hunter2")
    assert load_signing_key(str(locked)).id


def test_keys_torpor_cannot_use_are_refused_in_words(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSIGN_PASSWORD", "x")
    p384, p384_pub = write_key(tmp_path, "p384", curve=ec.SECP384R1())
    with pytest.raises(ConfigError, match="not an ECDSA P-256 key"):
        load_signing_key(str(p384))
    with pytest.raises(ConfigError, match="not an ECDSA P-256 key"):
        load_trusted_key(str(p384_pub))
    cosign = tmp_path / "cosign.key"
    cosign.write_text("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\neyJr\n"
                      "-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match=r"the cosign key .* is malformed"):
        load_signing_key(str(cosign))
    with pytest.raises(ConfigError, match="is not a PEM public key"):
        load_trusted_key(str(cosign))
    with pytest.raises(ConfigError, match="cannot read the trusted key"):
        load_trusted_key(str(tmp_path / "missing.pub"))


def test_the_policy_is_one_of_three_words() -> None:
    assert Policy.of(Config()) is Policy.IF_PRESENT
    assert Policy.of(Config({"restore": {"signatures": "required"}})) is Policy.REQUIRED
    with pytest.raises(ConfigError, match='say "required", "if-present" or "off"'):
        Policy.of(Config({"restore": {"signatures": "yes"}}))


def test_the_node_remembers_the_images_it_made(tmp_path: Path) -> None:
    assert not own.made_here(str(tmp_path), DIGEST)
    own.record(str(tmp_path), DIGEST)
    own.record(str(tmp_path), DIGEST)
    assert own.made_here(str(tmp_path), DIGEST) and not own.made_here(str(tmp_path), OTHER)
    assert not own.made_here(str(tmp_path), "sha256:../../etc")


def test_a_signature_cosign_made_verifies_and_torpor_writes_the_same_documents(
        tmp_path: Path) -> None:
    """cosign 2.6.5's own `.sig` manifest, config and payload (tests/unit/data): torpor
    verifies the signature, and writes the same three documents byte for byte around it."""
    sample = json.loads((Path(__file__).parent / "data" / "cosign_signature.json").read_text())
    (tmp_path / "cosign.pub").write_text(sample["public_key"])
    trusted = load_trusted_key(str(tmp_path / "cosign.pub"))
    manifest = json.loads(sample["manifest"])
    [(layer, signature)] = signature_layers(manifest)
    payload = sample["payload"].encode()
    assert layer["digest"] == sha256_digest(payload)
    signed = SignatureLayer(payload, signature)
    assert status_of(signed, sample["image_digest"], [trusted]).verified_by == trusted.describe()
    assert status_of(signed, OTHER, [trusted]).verified_by is None
    assert make_payload(json.loads(payload)["critical"]["identity"]["docker-reference"],
                        sample["image_digest"]) == payload
    assert signature_manifest([signed]) == (sample["config"].encode(), sample["manifest"].encode())


def test_a_cosign_key_signs_with_its_password(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """cosign 2.6.5's own encrypted cosign.key (scrypt, NaCl secretbox) with COSIGN_PASSWORD."""
    sample = json.loads((Path(__file__).parent / "data" / "cosign_signature.json").read_text())
    (tmp_path / "cosign.key").write_text(sample["private_key"])
    (tmp_path / "cosign.pub").write_text(sample["public_key"])
    monkeypatch.delenv("COSIGN_PASSWORD", raising=False)
    with pytest.raises(ConfigError, match="is encrypted"):
        load_signing_key(str(tmp_path / "cosign.key"))
    monkeypatch.setenv("COSIGN_PASSWORD", "not-it")
    with pytest.raises(ConfigError, match="COSIGN_PASSWORD does not open the cosign key"):
        load_signing_key(str(tmp_path / "cosign.key"))
    monkeypatch.setenv("COSIGN_PASSWORD", sample["private_key_password"])
    key = load_signing_key(str(tmp_path / "cosign.key"))
    trusted = load_trusted_key(str(tmp_path / "cosign.pub"))
    assert key.id == trusted.id
    payload = make_payload("r/a", DIGEST)
    assert trusted.verifies(payload, key.sign(payload))


def test_inspect_shows_each_signature_and_its_verdict() -> None:
    from torpor.cli.inspect_cmd import _signature_lines
    from torpor.signing import SignatureCheck, SignatureStatus

    check = SignatureCheck(DIGEST, "team/web:sha256-ab.sig", Policy.REQUIRED, (
        SignatureStatus("sha256:" + "11" * 32, DIGEST, "ci.pub (key 0123456789abcdef)", None),
        SignatureStatus("sha256:" + "22" * 32, OTHER, None, f"it signs another image, {OTHER}")))
    assert _signature_lines(check) == [
        'signatures   2 in team/web:sha256-ab.sig ([restore] signatures = "required")',
        "  ok       sha256:111111111111  verified by ci.pub (key 0123456789abcdef)",
        f"  BAD      sha256:222222222222  not verified: it signs another image, {OTHER}"]
    assert _signature_lines(SignatureCheck(DIGEST, "w:t", Policy.IF_PRESENT, made_here=True)) == [
        'signatures   none in w:t; made by this node ([restore] signatures = "if-present")']
