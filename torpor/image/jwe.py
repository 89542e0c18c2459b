"""JSON Web Encryption (RFC 7516) as containers/ocicrypt's "jwe" key wrapper uses it.

ocicrypt wraps a layer's private options (its symmetric key, nonce and plaintext digest) in one
JWE for all recipients (go-jose's MultiEncrypter): content encryption A256GCM, the content key
wrapped per recipient with RSA-OAEP (RSA keys) or ECDH-ES+A256KW (EC keys), JSON serialization.
`seal` writes that: a protected header {"enc":"A256GCM"} and a `recipients` array whose headers
carry "alg" (and "epk"); go-jose reads it whatever the number of recipients.
`open_sealed` reads what go-jose writes: the general or flattened JSON serialization (one
recipient) or the compact one, with RSA-OAEP, RSA-OAEP-256, ECDH-ES+A128KW/A192KW/A256KW and
A128GCM/A192GCM/A256GCM (newer ocicrypt accepts these on JWK recipients). Every primitive is
the `cryptography` library's; this module only lays out the bytes.
"""

from __future__ import annotations

import base64
import json
import os
import struct
from collections.abc import Iterable
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.concatkdf import ConcatKDFHash
from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap, aes_key_wrap

from torpor.image.encryption_keys import CURVE_NAMES, PrivateKey, PublicKey

CONTENT_KEY_BYTES = {"A128GCM": 16, "A192GCM": 24, "A256GCM": 32}
ECDH_KEY_BYTES = {"ECDH-ES+A128KW": 16, "ECDH-ES+A192KW": 24, "ECDH-ES+A256KW": 32}
RSA_OAEP_HASHES: dict[str, type[hashes.HashAlgorithm]] = {
    "RSA-OAEP": hashes.SHA1, "RSA-OAEP-256": hashes.SHA256}
_CURVES: dict[str, ec.EllipticCurve] = {
    "P-256": ec.SECP256R1(), "P-384": ec.SECP384R1(), "P-521": ec.SECP521R1()}


class MalformedJwe(ValueError):
    """The document is not a JWE this module can read (the caller names the layer)."""


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: object) -> bytes:
    if not isinstance(text, str):
        raise MalformedJwe("a base64url member is not a string")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        raise MalformedJwe("a member is not base64url") from None


def seal(plaintext: bytes, recipients: Iterable[PublicKey]) -> bytes:
    """A JWE (JSON serialization) of `plaintext` that each recipient's private key opens."""
    content_key = os.urandom(32)
    entries = [_wrap_content_key(content_key, key) for key in recipients]
    if not entries:
        raise ValueError("a JWE needs at least one recipient")
    protected = b64url(b'{"enc":"A256GCM"}')
    iv = os.urandom(12)
    sealed = AESGCM(content_key).encrypt(iv, plaintext, protected.encode())
    document = {"protected": protected, "recipients": entries, "iv": b64url(iv),
                "ciphertext": b64url(sealed[:-16]), "tag": b64url(sealed[-16:])}
    return json.dumps(document, separators=(",", ":")).encode()


def _wrap_content_key(content_key: bytes, key: PublicKey) -> dict[str, Any]:
    if isinstance(key, rsa.RSAPublicKey):
        wrapped = key.encrypt(content_key, _oaep(hashes.SHA1))
        return {"header": {"alg": "RSA-OAEP"}, "encrypted_key": b64url(wrapped)}
    alg = "ECDH-ES+A256KW"
    ephemeral = ec.generate_private_key(key.curve)
    kek = _concat_kdf(ephemeral.exchange(ec.ECDH(), key), alg, b"", b"", ECDH_KEY_BYTES[alg])
    return {"header": {"alg": alg, "epk": _public_jwk(ephemeral.public_key())},
            "encrypted_key": b64url(aes_key_wrap(kek, content_key))}


def open_sealed(document: bytes, key: PrivateKey) -> bytes | None:
    """The plaintext of a JWE if `key` opens it, None if it does not; MalformedJwe if unreadable."""
    parsed = _parse(document)
    protected_b64 = parsed.get("protected") or ""
    protected = _json_object(unb64url(protected_b64)) if protected_b64 else {}
    shared = {**protected, **_members(parsed.get("unprotected"))}
    if shared.get("zip"):
        raise MalformedJwe(f"compressed JWE ({shared['zip']}) is not supported")
    aad = protected_b64 + ("." + str(parsed["aad"]) if parsed.get("aad") else "")
    for entry in _recipients(parsed):
        header = {**shared, **_members(entry.get("header"))}
        content_key = _unwrap_content_key(header, unb64url(entry.get("encrypted_key", "")), key)
        if content_key is None:
            continue
        enc = header.get("enc")
        if enc not in CONTENT_KEY_BYTES:
            raise MalformedJwe(f"content encryption {enc!r} is not one of {', '.join(CONTENT_KEY_BYTES)}")
        if len(content_key) != CONTENT_KEY_BYTES[enc]:
            raise MalformedJwe(f"the content key is {len(content_key)} bytes, not what {enc} takes")
        sealed = unb64url(parsed.get("ciphertext")) + unb64url(parsed.get("tag"))
        try:
            return AESGCM(content_key).decrypt(unb64url(parsed.get("iv")), sealed, aad.encode())
        except InvalidTag:
            raise MalformedJwe("the JWE's content fails its GCM tag: it was altered") from None
    return None


def describe_recipients(document: bytes) -> list[str]:
    """What each recipient of a JWE is: "RSA-OAEP", "ECDH-ES+A256KW P-256" (keys carry no names)."""
    parsed = _parse(document)
    protected_b64 = parsed.get("protected") or ""
    shared = _json_object(unb64url(protected_b64)) if protected_b64 else {}
    out = []
    for entry in _recipients(parsed):
        header = {**shared, **_members(entry.get("header"))}
        epk = header.get("epk")
        curve = f" {epk.get('crv')}" if isinstance(epk, dict) else ""
        out.append(f"{header.get('alg', '?')}{curve}")
    return out


def _parse(document: bytes) -> dict[str, Any]:
    text = document.decode("ascii", errors="replace").strip()
    if not text.startswith("{"):  # compact: header.encrypted_key.iv.ciphertext.tag
        parts = text.split(".")
        if len(parts) != 5:
            raise MalformedJwe("neither a JSON nor a compact JWE")
        return {"protected": parts[0], "encrypted_key": parts[1], "iv": parts[2],
                "ciphertext": parts[3], "tag": parts[4]}
    return _json_object(document)


def _recipients(parsed: dict[str, Any]) -> list[dict[str, Any]]:
    """The general serialization's recipients, or the flattened one's single recipient."""
    entries = parsed.get("recipients") or [{"header": parsed.get("header"),
                                            "encrypted_key": parsed.get("encrypted_key", "")}]
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise MalformedJwe("'recipients' is not a list of objects")
    return entries


def _members(value: object) -> dict[str, Any]:
    """A header object (absent is empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedJwe("a JWE header is not an object")
    return value


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise MalformedJwe("not JSON") from None
    if not isinstance(value, dict):
        raise MalformedJwe("not a JSON object")
    return value


def _unwrap_content_key(header: dict[str, Any], wrapped: bytes, key: PrivateKey) -> bytes | None:
    alg = header.get("alg")
    if alg in RSA_OAEP_HASHES:
        if not isinstance(key, rsa.RSAPrivateKey):
            return None
        try:
            return key.decrypt(wrapped, _oaep(RSA_OAEP_HASHES[alg]))
        except ValueError:
            return None
    if alg in ECDH_KEY_BYTES:
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            return None
        ephemeral = _ec_public_key(header.get("epk"))
        if ephemeral.curve.name != key.curve.name:
            return None
        kek = _concat_kdf(key.exchange(ec.ECDH(), ephemeral), alg, unb64url(header.get("apu", "")),
                          unb64url(header.get("apv", "")), ECDH_KEY_BYTES[alg])
        try:
            return aes_key_unwrap(kek, wrapped)
        except InvalidUnwrap:
            return None
    return None  # an algorithm torpor does not implement: no key of its opens this recipient


def _oaep(hash_type: type[hashes.HashAlgorithm]) -> padding.OAEP:
    return padding.OAEP(mgf=padding.MGF1(hash_type()), algorithm=hash_type(), label=None)


def _concat_kdf(shared_secret: bytes, alg: str, apu: bytes, apv: bytes, length: int) -> bytes:
    """RFC 7518 4.6.2: Concat KDF (SHA-256) with AlgorithmID, PartyUInfo, PartyVInfo, SuppPubInfo."""
    other_info = b"".join(struct.pack(">I", len(part)) + part for part in (alg.encode(), apu, apv))
    other_info += struct.pack(">I", length * 8)
    return ConcatKDFHash(hashes.SHA256(), length, other_info).derive(shared_secret)


def _public_jwk(key: ec.EllipticCurvePublicKey) -> dict[str, str]:
    size = (key.curve.key_size + 7) // 8
    numbers = key.public_numbers()
    return {"kty": "EC", "crv": CURVE_NAMES[key.curve.name],
            "x": b64url(numbers.x.to_bytes(size, "big")), "y": b64url(numbers.y.to_bytes(size, "big"))}


def _ec_public_key(jwk: object) -> ec.EllipticCurvePublicKey:
    if not isinstance(jwk, dict) or jwk.get("kty") != "EC" or jwk.get("crv") not in _CURVES:
        raise MalformedJwe("the ECDH-ES header has no EC P-256/P-384/P-521 'epk'")
    x, y = (int.from_bytes(unb64url(jwk.get(c)), "big") for c in ("x", "y"))
    try:
        return ec.EllipticCurvePublicNumbers(x, y, _CURVES[jwk["crv"]]).public_key()
    except ValueError:
        raise MalformedJwe("the ECDH-ES 'epk' is not a point of its curve") from None
