"""Signing and trusted keys: ECDSA P-256 in PEM files, as openssl and cosign write them.

A signing key is a PEM private key: PKCS#8 (`-----BEGIN PRIVATE KEY-----`, what `openssl
genpkey` writes) or SEC1 (`-----BEGIN EC PRIVATE KEY-----`), encrypted PKCS#8, or cosign's own
encrypted `cosign.key` (cosign_key.py); the password of an encrypted one is in
COSIGN_PASSWORD. A trusted key is a PEM SubjectPublicKeyInfo (`-----BEGIN PUBLIC KEY-----`,
what `openssl pkey -pubout` and `cosign generate-key-pair` write as cosign.pub). Signatures are
ECDSA with SHA-256, DER-encoded, as cosign makes and checks them. A key is named in messages by
its file and its id: the first 16 hex digits of the SHA-256 of its SubjectPublicKeyInfo (DER).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from torpor.errors import ConfigError
from torpor.signing import cosign_key

PASSWORD_ENV = "COSIGN_PASSWORD"


def key_id(public: ec.EllipticCurvePublicKey) -> str:
    der = public.public_bytes(serialization.Encoding.DER,
                              serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()[:16]


@dataclass(frozen=True)
class SigningKey:
    path: str
    key: ec.EllipticCurvePrivateKey

    @property
    def id(self) -> str:
        return key_id(self.key.public_key())

    def sign(self, payload: bytes) -> bytes:
        """The DER ECDSA signature of `payload` (SHA-256)."""
        return self.key.sign(payload, ec.ECDSA(hashes.SHA256()))


@dataclass(frozen=True)
class TrustedKey:
    path: str
    key: ec.EllipticCurvePublicKey

    @property
    def id(self) -> str:
        return key_id(self.key)

    def verifies(self, payload: bytes, signature_der: bytes) -> bool:
        try:
            self.key.verify(signature_der, payload, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            return False
        return True

    def describe(self) -> str:
        return f"{self.path} (key {self.id})"


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError as e:
        raise ConfigError(f"cannot read the {what} {path}: {e.strerror}") from None


def _p256(key: object, path: str, what: str) -> None:
    curve = getattr(key, "curve", None)
    if not isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) or \
            not isinstance(curve, ec.SECP256R1):
        raise ConfigError(f"the {what} {path} is not an ECDSA P-256 key",
                          hint="make one: openssl genpkey -algorithm EC -pkeyopt "
                               "ec_paramgen_curve:P-256 -out signing.pem")


def load_signing_key(path: str) -> SigningKey:
    data = _read(path, "signing key")
    password = os.environ.get(PASSWORD_ENV)
    if cosign_key.is_cosign_key(data) and password is None:
        raise ConfigError(f"the cosign key {path} is encrypted",
                          hint=f"give its password in {PASSWORD_ENV}")
    try:
        if cosign_key.is_cosign_key(data):
            key = serialization.load_der_private_key(
                cosign_key.decrypt(data, password or "", path), None)
        else:
            key = serialization.load_pem_private_key(
                data, password.encode() if password and b"ENCRYPTED" in data else None)
    except TypeError:
        raise ConfigError(f"the signing key {path} is encrypted",
                          hint=f"give its password in {PASSWORD_ENV}") from None
    except (ValueError, UnsupportedAlgorithm) as e:
        raise ConfigError(f"the signing key {path} is not a PEM private key torpor can read "
                          f"({e})") from None
    _p256(key, path, "signing key")
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return SigningKey(path, key)


def load_trusted_key(path: str) -> TrustedKey:
    data = _read(path, "trusted key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError(f"the trusted key {path} is not a PEM public key",
                          hint="give the signer's public key (openssl pkey -in signing.pem "
                               "-pubout -out signing.pub; cosign: cosign.pub)") from None
    _p256(key, path, "trusted key")
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return TrustedKey(path, key)
