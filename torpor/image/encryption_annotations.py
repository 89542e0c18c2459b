"""The annotations of an ocicrypt-encrypted layer: writing them, and opening them with private keys.

  org.opencontainers.image.enc.pubopts   base64 of {"cipher":"AES_256_CTR_HMAC_SHA256",
                                         "hmac":B64,"cipheroptions":{}}, in the clear
  org.opencontainers.image.enc.keys.jwe  base64 of a JWE sealing {"symkey":B64,"digest":
                                         "sha256:<plain blob>","cipheroptions":{"nonce":B64}}
                                         for every recipient; several JWEs joined with commas
Go's encoding/json writes []byte as padded standard base64 and keeps the field order above;
torpor writes the same bytes. Other schemes (pgp, pkcs7, pkcs11, key providers) put their
wrapped keys in other `...enc.keys.<scheme>` annotations; torpor reads only jwe, and says so.
The public options are not authenticated: torpor takes the nonce only from the sealed options
(ocicrypt would prefer a nonce in the public ones; none of its versions writes one there).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from torpor.errors import DecryptionError
from torpor.image import jwe
from torpor.image.encryption_keys import DecryptionKey, Recipient

ANNOTATION_PREFIX = "org.opencontainers.image.enc."
KEYS_PREFIX = "org.opencontainers.image.enc.keys."
KEYS_JWE = "org.opencontainers.image.enc.keys.jwe"
PUBOPTS = "org.opencontainers.image.enc.pubopts"
CIPHER = "AES_256_CTR_HMAC_SHA256"
DIGEST_ALGORITHMS = ("sha256", "sha384", "sha512")  # those go-digest names


class LayerKey(NamedTuple):
    """What the sealed private options hold; `digest` is "" when the producer recorded none."""

    symmetric_key: bytes
    nonce: bytes
    digest: str


def sealed_annotations(layer_key: LayerKey, hmac: bytes, recipients: Sequence[Recipient]) -> dict[str, str]:
    private = {"symkey": _b64(layer_key.symmetric_key), "digest": layer_key.digest,
               "cipheroptions": {"nonce": _b64(layer_key.nonce)}}
    public = {"cipher": CIPHER, "hmac": _b64(hmac), "cipheroptions": {}}
    sealed = jwe.seal(_json(private), [r.key for r in recipients])
    return {KEYS_JWE: _b64(sealed), PUBOPTS: _b64(_json(public))}


def layer_recipients(annotations: Mapping[str, str]) -> list[str]:
    """What the jwe recipients of a layer are ("RSA-OAEP", "ECDH-ES+A256KW P-256"), for messages."""
    out: list[str] = []
    for document in _jwe_documents(annotations.get(KEYS_JWE, "")):
        try:
            out += jwe.describe_recipients(document)
        except jwe.MalformedJwe:
            out.append("unreadable JWE")
    return out


def expected_hmac(layer: str, annotations: Mapping[str, str]) -> bytes:
    """The HMAC-SHA256 of the ciphertext that the public options announce."""
    try:
        public = json.loads(base64.b64decode(annotations[PUBOPTS], validate=True))
        cipher, mac = public["cipher"], base64.b64decode(public["hmac"], validate=True)
    except KeyError as e:
        raise DecryptionError(f"{layer} has no {e.args[0]} in its encryption public options "
                              f"({PUBOPTS}): its cipher or HMAC is unknown") from None
    except (ValueError, TypeError, binascii.Error):
        raise DecryptionError(f"{layer}: its annotation {PUBOPTS} is not base64 JSON") from None
    if cipher != CIPHER:
        raise DecryptionError(f"{layer} is encrypted with {cipher!r}; torpor and ocicrypt know only {CIPHER}")
    if len(mac) != 32:
        raise DecryptionError(f"{layer}: the HMAC in {PUBOPTS} is {len(mac)} bytes, not 32")
    return mac


def open_layer_key(layer: str, annotations: Mapping[str, str], keys: Sequence[DecryptionKey],
                   keys_from: str = "") -> LayerKey:
    """The layer's key, from the first JWE that one of `keys` opens; DecryptionError if none does
    (`keys_from`: where the keys came from, for the message; default: --decryption-key)."""
    schemes = sorted(k.removeprefix(KEYS_PREFIX) for k in annotations if k.startswith(KEYS_PREFIX))
    if "jwe" not in schemes:
        what = f"for {', '.join(schemes)} recipients only" if schemes else "without any wrapped key"
        raise DecryptionError(f"{layer} is encrypted {what}; torpor opens only jwe: recipients",
                              hint="encrypt it for an RSA or EC key: --encryption-key jwe:PUBKEY.pem")
    recipients = ", ".join(layer_recipients(annotations)) or "none readable"
    if not keys:
        raise DecryptionError(f"{layer} is encrypted and no --decryption-key was given "
                              f"(recipients: {recipients})",
                              hint="give the private key of one of its recipients: --decryption-key KEY.pem")
    problems: list[str] = []
    for document in _jwe_documents(annotations[KEYS_JWE]):
        for key in keys:
            try:
                opened = jwe.open_sealed(document, key.key)
            except jwe.MalformedJwe as e:
                problems.append(str(e))
                break
            if opened is not None:
                return _layer_key(layer, opened)
    tried = ", ".join(k.describe() for k in keys)
    detail = f"; unreadable: {'; '.join(problems)}" if problems else ""
    offered = f"the keys in {keys_from}" if keys_from else "the given --decryption-key files"
    raise DecryptionError(f"{layer} is encrypted for other keys: none of {offered} opens it "
                          f"(recipients: {recipients}; tried: {tried}){detail}")


def _layer_key(layer: str, opened: bytes) -> LayerKey:
    try:
        private: Any = json.loads(opened)
        symmetric_key = base64.b64decode(private["symkey"], validate=True)
        nonce = base64.b64decode(private["cipheroptions"]["nonce"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise DecryptionError(f"{layer}: its sealed options lack a base64 symkey or nonce") from None
    if len(symmetric_key) != 32 or len(nonce) != 16:
        raise DecryptionError(f"{layer}: its sealed key is {len(symmetric_key)} bytes and nonce "
                              f"{len(nonce)}, not 32 and 16 (AES-256-CTR)")
    digest = private.get("digest") or ""
    algorithm, _, hex_part = str(digest).partition(":")
    if digest and (algorithm not in DIGEST_ALGORITHMS or not hex_part):
        raise DecryptionError(f"{layer}: its sealed plain digest {digest!r} is not one torpor can check")
    return LayerKey(symmetric_key, nonce, str(digest))


def _jwe_documents(annotation: str) -> Iterator[bytes]:
    for part in annotation.split(","):
        try:
            yield base64.b64decode(part.strip(), validate=True)
        except binascii.Error:
            continue


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
