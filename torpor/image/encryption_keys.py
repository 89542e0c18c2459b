"""The keys of encrypted layers: recipients (`jwe:PUBKEY.pem`) and decryption keys (`KEY.pem`).

What containers/ocicrypt's "jwe" scheme takes, so that the same files work with skopeo:
  - a recipient is an RSA or EC (P-256, P-384, P-521) public key, PEM or DER SubjectPublicKeyInfo
    (`openssl pkey -pubout`); a certificate is not a jwe recipient (skopeo refuses it too);
  - a decryption key is the matching private key, PEM or DER, PKCS#8, PKCS#1 (RSA) or SEC1 (EC),
    optionally password-protected: `KEY.pem:pass=SECRET`, `KEY.pem:file=PASSWORD_FILE` or
    `KEY.pem:SECRET`, as skopeo's `--decryption-key` writes it. skopeo 1.9 itself reads EC keys
    only as PKCS#8 (`-----BEGIN PRIVATE KEY-----`); torpor reads all of these.
A file that is not such a key is a ConfigError naming the file and what was expected.

A node's own keys come from its configuration (`node_recipients`, `node_keys`): `[image]
encrypt_recipients` are added to every image the node builds, and `[restore] decryption_keys`
(files, or directories of them, as containerd's /etc/containerd/ocicrypt/keys) to every key a
command is given.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from torpor.errors import ConfigError

if TYPE_CHECKING:
    from torpor.config import Config

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey
Sourced = TypeVar("Sourced", "Recipient", "DecryptionKey")
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey

JWE_PREFIX = "jwe:"
CURVE_NAMES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}
_KEY_HELP = "an RSA or EC (P-256, P-384, P-521) key"


@dataclass(frozen=True)
class Recipient:
    """A public key that an encrypted layer is wrapped for; `source` is the file it came from."""

    key: PublicKey
    source: str

    def describe(self) -> str:
        return f"{self.source} ({describe_key(self.key)})"


@dataclass(frozen=True)
class DecryptionKey:
    """A private key that may open encrypted layers; `source` is the file it came from."""

    key: PrivateKey
    source: str

    def describe(self) -> str:
        return f"{self.source} ({describe_key(self.key.public_key())})"


def describe_key(key: PublicKey) -> str:
    """"RSA 2048" or "EC P-256"."""
    if isinstance(key, rsa.RSAPublicKey):
        return f"RSA {key.key_size}"
    return f"EC {CURVE_NAMES.get(key.curve.name, key.curve.name)}"


def parse_recipient(spec: str) -> Recipient:
    """A recipient from `jwe:PATH` (the form of skopeo's --encryption-key)."""
    scheme, sep, path = spec.partition(":")
    if not sep or scheme != "jwe" or not path:
        raise ConfigError(f"encryption recipient {spec!r} is not jwe:PATH",
                          hint="torpor encrypts for JWE recipients: jwe:PUBKEY.pem, an RSA or EC public key")
    return load_recipient(path)


def load_recipient(path: str) -> Recipient:
    data = _read(path, "encryption recipient")
    try:
        key = (serialization.load_pem_public_key(data) if b"-----BEGIN" in data
               else serialization.load_der_public_key(data))
    except (ValueError, TypeError, UnicodeDecodeError):
        hint = "a public key in PEM or DER (openssl pkey -in KEY.pem -pubout)"
        if b"CERTIFICATE-----" in data:
            hint = "it is a certificate: take its public key with openssl x509 -pubkey -noout -in CERT"
        elif b"PRIVATE KEY-----" in data:
            hint = "it is a private key: give its public half (openssl pkey -in KEY.pem -pubout)"
        raise ConfigError(f"encryption recipient {path} is not a public key", hint=hint) from None
    if not _supported(key):
        raise ConfigError(f"encryption recipient {path} is {type(key).__name__}, not {_KEY_HELP}")
    return Recipient(key, path)  # type: ignore[arg-type]  # narrowed by _supported


def parse_decryption_key(spec: str) -> DecryptionKey:
    """A private key from `PATH`, `PATH:pass=SECRET`, `PATH:file=PASSWORD_FILE` or `PATH:SECRET`."""
    if os.path.exists(spec) or ":" not in spec:
        return load_decryption_key(spec)
    path, _, secret = spec.partition(":")
    if not secret.startswith("file="):
        return load_decryption_key(path, secret.removeprefix("pass=").encode())
    password = _read(secret[5:], f"password file of decryption key {path}")
    try:
        return load_decryption_key(path, password)  # as skopeo reads it: the whole file
    except ConfigError:
        if password == password.rstrip(b"\r\n"):
            raise
        return load_decryption_key(path, password.rstrip(b"\r\n"))  # echo SECRET > FILE


def load_decryption_key(path: str, password: bytes | None = None) -> DecryptionKey:
    data = _read(path, "decryption key")
    try:
        key = (serialization.load_pem_private_key(data, password) if b"-----BEGIN" in data
               else serialization.load_der_private_key(data, password))
    except TypeError as e:  # a password for a plain key, or none for an encrypted one
        if password is None:
            raise ConfigError(f"decryption key {path} is password-protected",
                              hint=f"give it as {path}:file=PASSWORD_FILE or {path}:pass=PASSWORD") from None
        raise ConfigError(f"decryption key {path}: {e}") from None
    except (ValueError, UnicodeDecodeError):
        if password is not None and b"ENCRYPTED" in data:
            raise ConfigError(f"decryption key {path}: wrong password") from None
        raise ConfigError(f"decryption key {path} is not a private key",
                          hint=f"expected {_KEY_HELP} in PEM or DER") from None
    if not _supported(key):
        raise ConfigError(f"decryption key {path} is {type(key).__name__}, not {_KEY_HELP}")
    return DecryptionKey(key, path)  # type: ignore[arg-type]  # narrowed by _supported


def node_recipients(cfg: Config, given: Sequence[Recipient] = ()) -> tuple[Recipient, ...]:
    """`given` (--encrypt-recipient) and the node's ([image] encrypt_recipients), each file once."""
    return _each_file_once([*given, *(parse_recipient(spec)
                                      for spec in cfg.image_encrypt_recipients)])


def node_keys(cfg: Config, given: Sequence[DecryptionKey] = ()) -> tuple[DecryptionKey, ...]:
    """`given` (--decryption-key) and the node's ([restore] decryption_keys), each file once."""
    return _each_file_once([*given, *keys_in(cfg.restore_decryption_keys)])


def _each_file_once(keys: list[Sourced]) -> tuple[Sourced, ...]:
    """`keys` in order, each file (by its real path) the first time only."""
    seen: set[str] = set()
    found = []
    for key in keys:
        if os.path.realpath(key.source) not in seen:
            seen.add(os.path.realpath(key.source))
            found.append(key)
    return tuple(found)


def keys_in(paths: Sequence[str]) -> tuple[DecryptionKey, ...]:
    """The private keys at `paths`: a file is a key; a directory holds keys, as containerd's
    ocicrypt key directory does: each plain file in it (hidden ones aside) is a private key, or a
    public key or certificate beside one, which is passed over."""
    keys: list[DecryptionKey] = []
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except OSError as e:
            raise ConfigError(f"cannot read decryption keys {path}: {e.strerror}") from None
        if not stat.S_ISDIR(mode):
            keys.append(load_decryption_key(path))
            continue
        for name in sorted(os.listdir(path)):
            file = os.path.join(path, name)
            if name.startswith(".") or not os.path.isfile(file):
                continue
            data = _read(file, "decryption key")
            if b"PRIVATE KEY-----" not in data and _public_only(data):
                continue
            keys.append(load_decryption_key(file))
    return tuple(keys)


def _public_only(data: bytes) -> bool:
    """A public key or a certificate (PEM or DER), which a key directory may hold beside its
    private keys."""
    if b"PUBLIC KEY-----" in data or b"CERTIFICATE-----" in data:
        return True
    from cryptography import x509

    for load in (serialization.load_der_public_key, x509.load_der_x509_certificate):
        try:
            load(data)
            return True
        except (ValueError, TypeError):
            continue
    return False


def _supported(key: object) -> bool:
    if isinstance(key, rsa.RSAPublicKey | rsa.RSAPrivateKey):
        return True
    return isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey) \
        and key.curve.name in CURVE_NAMES


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None
