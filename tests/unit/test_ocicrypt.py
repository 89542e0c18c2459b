"""Layer encryption in ocicrypt's format, without skopeo: round trips for every key kind, several
recipients, wrong and missing keys, altered blobs (nothing decrypted is left on disk), empty and
large blobs (streamed: memory stays flat), and layers that skopeo 1.9.3 encrypted (data/ocicrypt).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa, x25519

from torpor.errors import ConfigError, DecryptionError, DigestMismatch, ImageError
from torpor.image import jwe, ocicrypt
from torpor.image.encryption_keys import (
    DecryptionKey,
    Recipient,
    load_decryption_key,
    parse_decryption_key,
    parse_recipient,
)

DATA = Path(__file__).parent / "data" / "ocicrypt"
ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"
KEY_FILES = {"rsa2048": "rsa2048.pem", "rsa4096": "rsa4096.pem", "ec-p256": "ec-p256.pem"}
CURVES = {"ec-p384": ec.SECP384R1(), "ec-p521": ec.SECP521R1()}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Recipient, DecryptionKey]]:
    """name -> (recipient from jwe:PUB.pem, decryption key from KEY.pem), every kind ocicrypt wraps for."""
    directory = tmp_path_factory.mktemp("keys")
    private_files = {name: DATA / file for name, file in KEY_FILES.items()}
    for name, curve in CURVES.items():
        pem = ec.generate_private_key(curve).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,  # SEC1
            serialization.NoEncryption())
        private_files[name] = directory / f"{name}.pem"
        private_files[name].write_bytes(pem)
    out = {}
    for name, private_file in private_files.items():
        if name == "rsa4096":  # checking a 4096-bit key's primes takes 0.2-0.7 s; rsa2048 checks loading
            key = serialization.load_pem_private_key(private_file.read_bytes(), None,
                                                     unsafe_skip_rsa_key_validation=True)
            assert isinstance(key, rsa.RSAPrivateKey)
            private = DecryptionKey(key, str(private_file))
        else:
            private = load_decryption_key(str(private_file))
        public_file = directory / f"{name}.pub"
        public_file.write_bytes(private.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        out[name] = (parse_recipient(f"jwe:{public_file}"), private)
    return out


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def encrypt(tmp_path: Path, plain: bytes, recipients: list[Recipient],
            media_type: str = ZSTD_LAYER) -> tuple[Path, dict[str, Any]]:
    """The encrypted blob's path and its descriptor."""
    src = write(tmp_path / "plain", plain)
    result = ocicrypt.encrypt_blob(src, str(tmp_path / "encrypted"), media_type, recipients)
    descriptor = {"mediaType": result.media_type, "digest": result.digest, "size": result.size,
                  "annotations": result.annotations}
    return tmp_path / "encrypted", descriptor


def sealed_options(descriptor: dict[str, Any], key: DecryptionKey) -> dict[str, Any]:
    document = base64.b64decode(descriptor["annotations"][ocicrypt.KEYS_JWE].split(",")[0])
    opened = jwe.open_sealed(document, key.key)
    assert opened is not None
    value: dict[str, Any] = json.loads(opened)
    return value


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("name", ["rsa2048", "rsa4096", "ec-p256", "ec-p384", "ec-p521"])
def test_round_trip_in_ocicrypts_format(tmp_path: Path, keys: dict[str, Any], name: str) -> None:
    recipient, private = keys[name]
    plain = os.urandom(300_000)
    encrypted, descriptor = encrypt(tmp_path, plain, [recipient])
    blob = encrypted.read_bytes()
    assert descriptor["mediaType"] == ZSTD_LAYER + "+encrypted"
    assert descriptor["digest"] == "sha256:" + hashlib.sha256(blob).hexdigest()
    assert descriptor["size"] == len(blob) == len(plain) and blob != plain
    assert set(descriptor["annotations"]) == {ocicrypt.KEYS_JWE, ocicrypt.PUBOPTS}
    public = json.loads(base64.b64decode(descriptor["annotations"][ocicrypt.PUBOPTS]))
    assert list(public) == ["cipher", "hmac", "cipheroptions"] and public["cipheroptions"] == {}
    assert public["cipher"] == "AES_256_CTR_HMAC_SHA256" and len(base64.b64decode(public["hmac"])) == 32
    private_options = sealed_options(descriptor, private)
    assert list(private_options) == ["symkey", "digest", "cipheroptions"]
    assert private_options["digest"] == "sha256:" + hashlib.sha256(plain).hexdigest()
    assert len(base64.b64decode(private_options["symkey"])) == 32
    assert len(base64.b64decode(private_options["cipheroptions"]["nonce"])) == 16

    result = ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / "decrypted"), descriptor, [private])
    assert (tmp_path / "decrypted").read_bytes() == plain
    assert result == (ZSTD_LAYER, private_options["digest"], len(plain))
    assert (tmp_path / "decrypted").stat().st_mode & 0o777 == 0o600


def test_every_recipient_opens_the_layer_alone(tmp_path: Path, keys: dict[str, Any]) -> None:
    names = ["rsa2048", "ec-p256", "ec-p521"]
    encrypted, descriptor = encrypt(tmp_path, b"shared by three nodes", [keys[n][0] for n in names])
    assert ocicrypt.layer_recipients(descriptor["annotations"]) == [
        "RSA-OAEP", "ECDH-ES+A256KW P-256", "ECDH-ES+A256KW P-521"]
    for name in names:
        ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / name), descriptor, [keys[name][1]])
        assert (tmp_path / name).read_bytes() == b"shared by three nodes"


def test_a_recipient_added_later_as_a_second_jwe(tmp_path: Path, keys: dict[str, Any]) -> None:
    """ocicrypt adds recipients to an encrypted layer by appending ",<base64 JWE>"."""
    encrypted, descriptor = encrypt(tmp_path, b"layer", [keys["rsa2048"][0]])
    options = json.dumps(sealed_options(descriptor, keys["rsa2048"][1])).encode()
    added = base64.b64encode(jwe.seal(options, [keys["ec-p384"][0].key])).decode()
    descriptor["annotations"][ocicrypt.KEYS_JWE] += "," + added
    ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / "out"), descriptor, [keys["ec-p384"][1]])
    assert (tmp_path / "out").read_bytes() == b"layer"


def test_wrong_key_is_refused_and_says_who_can_open_it(tmp_path: Path, keys: dict[str, Any]) -> None:
    encrypted, descriptor = encrypt(tmp_path, b"secret", [keys["rsa2048"][0], keys["ec-p256"][0]])
    wrong = [keys["rsa4096"][1], keys["ec-p384"][1]]
    with pytest.raises(DecryptionError) as caught:
        ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / "out"), descriptor, wrong)
    message = str(caught.value)
    assert f"layer {descriptor['digest']} is encrypted for other keys" in message
    assert "recipients: RSA-OAEP, ECDH-ES+A256KW P-256" in message
    assert "rsa4096.pem (RSA 4096)" in message and "ec-p384.pem (EC P-384)" in message
    assert files_in(tmp_path) == ["encrypted", "plain"]


def test_missing_key_is_refused_before_anything_is_written(tmp_path: Path, keys: dict[str, Any]) -> None:
    encrypted, descriptor = encrypt(tmp_path, b"secret", [keys["ec-p256"][0]])
    with pytest.raises(DecryptionError, match="no --decryption-key was given"):
        ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / "out"), descriptor, [])
    assert files_in(tmp_path) == ["encrypted", "plain"]


Tamper = Callable[[Path, dict[str, Any]], None]


def rewritten(blob: Path, descriptor: dict[str, Any], data: bytes) -> None:
    """The blob changed, and its descriptor with it (no key: the HMAC is what catches it)."""
    blob.write_bytes(data)
    descriptor.update(digest="sha256:" + hashlib.sha256(data).hexdigest(), size=len(data))


def flip_a_byte(blob: Path, descriptor: dict[str, Any]) -> None:
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    rewritten(blob, descriptor, bytes(data))


def truncate(blob: Path, descriptor: dict[str, Any]) -> None:
    rewritten(blob, descriptor, blob.read_bytes()[:-1])


def replace_hmac(_: Path, descriptor: dict[str, Any]) -> None:
    public = json.loads(base64.b64decode(descriptor["annotations"][ocicrypt.PUBOPTS]))
    public["hmac"] = base64.b64encode(bytes(32)).decode()
    descriptor["annotations"][ocicrypt.PUBOPTS] = base64.b64encode(json.dumps(public).encode()).decode()


@pytest.mark.parametrize("tamper", [flip_a_byte, truncate, replace_hmac])
def test_altered_layer_fails_its_hmac_and_leaves_nothing(tmp_path: Path, keys: dict[str, Any],
                                                         tamper: Tamper) -> None:
    recipient, private = keys["ec-p256"]
    encrypted, descriptor = encrypt(tmp_path, os.urandom(3 << 20), [recipient])
    tamper(encrypted, descriptor)
    with pytest.raises(DecryptionError, match="fails its HMAC check"):
        ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / "out"), descriptor, [private])
    assert files_in(tmp_path) == ["encrypted", "plain"]


def test_a_blob_that_is_not_what_its_descriptor_says_is_refused(tmp_path: Path,
                                                                  keys: dict[str, Any]) -> None:
    recipient, private = keys["ec-p256"]
    encrypted, descriptor = encrypt(tmp_path, os.urandom(1 << 16), [recipient])
    encrypted.write_bytes(encrypted.read_bytes()[:-1])
    with pytest.raises(DigestMismatch, match="descriptor says"):
        ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / "out"), descriptor, [private])
    assert files_in(tmp_path) == ["encrypted", "plain"]


@pytest.mark.parametrize("document", [
    b"{}", b"[]", b"not json", b"a.b.c.d.e", b'{"recipients": 5}', b'{"protected": 5}',
    b'{"recipients": [{"header": "x"}]}', b'{"unprotected": [], "encrypted_key": "AA"}',
    b'{"recipients": [{"header": {"alg": "ECDH-ES+A256KW", "epk": {"kty": "EC", "crv": "P-256",'
    b' "x": "AA", "y": "AA"}}, "encrypted_key": "AA"}]}',
    b'{"header": {"alg": "RSA-OAEP", "enc": "A256GCM"}, "encrypted_key": 7}',
])
def test_malformed_wrapped_keys_are_a_clear_error(tmp_path: Path, keys: dict[str, Any],
                                                  document: bytes) -> None:
    encrypted, descriptor = encrypt(tmp_path, b"x", [keys["ec-p256"][0]])
    descriptor["annotations"][ocicrypt.KEYS_JWE] = base64.b64encode(document).decode()
    with pytest.raises(DecryptionError, match="is encrypted for other keys"):
        ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / "out"), descriptor,
                              [keys["ec-p256"][1], keys["rsa2048"][1]])
    assert files_in(tmp_path) == ["encrypted", "plain"]


def test_sealed_digest_that_does_not_match_leaves_nothing(tmp_path: Path, keys: dict[str, Any]) -> None:
    """A producer that records a wrong plain digest (ocicrypt copies it from the descriptor unchecked)."""
    recipient, private = keys["rsa2048"]
    encrypted, descriptor = encrypt(tmp_path, b"what was encrypted", [recipient])
    options = sealed_options(descriptor, private)
    options["digest"] = "sha256:" + hashlib.sha256(b"something else").hexdigest()
    resealed = jwe.seal(json.dumps(options).encode(), [recipient.key])
    descriptor["annotations"][ocicrypt.KEYS_JWE] = base64.b64encode(resealed).decode()
    with pytest.raises(DigestMismatch, match="nothing decrypted was kept"):
        ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / "out"), descriptor, [private])
    assert files_in(tmp_path) == ["encrypted", "plain"]


def test_empty_blob(tmp_path: Path, keys: dict[str, Any]) -> None:
    recipient, private = keys["ec-p256"]
    encrypted, descriptor = encrypt(tmp_path, b"", [recipient])
    assert descriptor["size"] == 0 and descriptor["digest"] == "sha256:" + hashlib.sha256(b"").hexdigest()
    result = ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / "out"), descriptor, [private])
    assert result.size == 0 and (tmp_path / "out").read_bytes() == b""


def test_large_blob_is_streamed_in_constant_memory(tmp_path: Path, keys: dict[str, Any]) -> None:
    recipient, private = keys["rsa2048"]
    size = 16 << 20   # four times the bound below: a copy held whole would show
    with open(tmp_path / "plain", "wb") as f:
        f.write(os.urandom(1 << 20))
        f.truncate(size)  # a hole reads as zeros, quickly
    tracemalloc.start()
    try:
        result = ocicrypt.encrypt_blob(str(tmp_path / "plain"), str(tmp_path / "encrypted"), ZSTD_LAYER,
                                       [recipient])
        descriptor = {"mediaType": result.media_type, "annotations": result.annotations}
        plain = ocicrypt.decrypt_blob(str(tmp_path / "encrypted"), str(tmp_path / "out"), descriptor,
                                      [private])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.size == plain.size == size
    assert peak < 4 << 20, f"{peak} bytes held at once while streaming {size}"
    assert os.path.getsize(tmp_path / "out") == size


@pytest.mark.parametrize("vector", range(2))
def test_opens_what_skopeo_1_9_encrypted(tmp_path: Path, vector: int) -> None:
    """go-jose 2.6's flattened JWE (one EC recipient) and general JWE (RSA and EC)."""
    document = json.loads((DATA / "skopeo-1.9.3.json").read_text())
    case = document["vectors"][vector]
    blob = write(tmp_path / "blob", base64.b64decode(case["blob_base64"]))
    plain = document["plain"]
    for key_file in case["keys"]:
        out = tmp_path / f"{key_file}.out"
        key = load_decryption_key(str(DATA / key_file))
        result = ocicrypt.decrypt_blob(blob, str(out), case["descriptor"], [key])
        assert out.read_bytes() == base64.b64decode(plain["blob_base64"])
        assert result == tuple(plain["descriptor"][field] for field in ("mediaType", "digest", "size"))


def test_layers_torpor_cannot_open_are_refused_by_name(tmp_path: Path, keys: dict[str, Any]) -> None:
    recipient, private = keys["ec-p256"]
    encrypted, descriptor = encrypt(tmp_path, b"x", [recipient])
    with pytest.raises(ImageError, match="already encrypted"):
        ocicrypt.encrypt_blob(str(encrypted), str(tmp_path / "again"), descriptor["mediaType"], [recipient])
    with pytest.raises(ImageError, match="is not encrypted"):
        ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / "out"),
                              {**descriptor, "mediaType": ZSTD_LAYER}, [private])
    public_options = descriptor["annotations"][ocicrypt.PUBOPTS]
    pkcs7_only = {**descriptor, "annotations": {"org.opencontainers.image.enc.keys.pkcs7": "eA==",
                                                ocicrypt.PUBOPTS: public_options}}
    with pytest.raises(DecryptionError, match="encrypted for pkcs7 recipients only"):
        ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / "out"), pkcs7_only, [private])
    other_cipher = base64.b64encode(b'{"cipher":"AES_128_GCM","hmac":"","cipheroptions":{}}').decode()
    with pytest.raises(DecryptionError, match="encrypted with 'AES_128_GCM'"):
        ocicrypt.decrypt_blob(str(encrypted), str(tmp_path / "out"), {**descriptor, "annotations": {
            **descriptor["annotations"], ocicrypt.PUBOPTS: other_cipher}}, [private])
    assert files_in(tmp_path) == ["encrypted", "plain"]


def test_key_files_as_skopeo_takes_them(tmp_path: Path, keys: dict[str, Any]) -> None:
    private = keys["ec-p256"][1].key
    write(tmp_path / "password", b"s3cret\n")
    # PKCS#8 encryption, and the PEM encryption (DEK-Info) that skopeo 1.9 reads
    for form in (serialization.PrivateFormat.PKCS8, serialization.PrivateFormat.TraditionalOpenSSL):
        encrypted_pem = private.private_bytes(serialization.Encoding.PEM, form,
                                              serialization.BestAvailableEncryption(b"s3cret"))
        key_file = write(tmp_path / "locked.pem", encrypted_pem)
        for spec in (f"{key_file}:pass=s3cret", f"{key_file}:file={tmp_path / 'password'}",
                     f"{key_file}:s3cret"):
            assert parse_decryption_key(spec).key.private_numbers() == private.private_numbers()
    with pytest.raises(ConfigError, match="is password-protected"):
        parse_decryption_key(key_file)
    with pytest.raises(ConfigError, match="wrong password"):
        parse_decryption_key(f"{key_file}:pass=guess")
    der = write(tmp_path / "key.der", private.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    assert load_decryption_key(der).key.private_numbers() == private.private_numbers()
    public_der = write(tmp_path / "pub.der", private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))
    assert parse_recipient(f"jwe:{public_der}").describe().endswith("(EC P-256)")


def test_key_files_that_are_not_keys_say_what_is_expected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not jwe:PATH"):
        parse_recipient(f"pgp:{DATA / 'rsa2048.pem'}")
    with pytest.raises(ConfigError, match="it is a private key: give its public half"):
        parse_recipient(f"jwe:{DATA / 'rsa2048.pem'}")
    certificate = write(tmp_path / "cert.pem",
                        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(ConfigError, match="it is a certificate"):
        parse_recipient(f"jwe:{certificate}")
    with pytest.raises(ConfigError, match="cannot read encryption recipient"):
        parse_recipient(f"jwe:{tmp_path / 'absent.pem'}")
    with pytest.raises(ConfigError, match="is not a private key"):
        load_decryption_key(write(tmp_path / "junk.pem", b"not a key"))
    x25519_key = x25519.X25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(ConfigError, match="not an RSA or EC"):
        load_decryption_key(write(tmp_path / "x25519.pem", x25519_key))
