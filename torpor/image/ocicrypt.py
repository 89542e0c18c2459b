"""Layer encryption in containers/ocicrypt's format: what torpor encrypts, skopeo (podman,
buildah, containerd's imgcrypt) decrypts, and the other way round.

An encrypted layer, as every ocicrypt from 1.0 (skopeo 1.9 of Debian 12 vendors 1.0.3) to 1.3
writes it:
  - media type: the plain one + "+encrypted" (`...tar+zstd+encrypted`); the plaintext is the
    plain blob as it was, compression included;
  - blob: AES-256-CTR of the plain blob, with a random 32-byte key and a random 16-byte nonce
    (the whole block is the big-endian counter), as long as the plain blob;
  - annotations (torpor.image.encryption_annotations): the HMAC-SHA256 of the whole ciphertext,
    keyed with the same key, in the clear; the key, the nonce and the plain blob's digest sealed
    in a JWE for the recipients (torpor.image.jwe).
Decryption trusts nothing before the end: the plaintext goes to a private temporary file (0600,
unpredictable name) beside the destination, and is renamed into place only once the HMAC of the
ciphertext and the plain digest sealed in the JWE both match; otherwise it is removed. (ocicrypt
streams the plaintext before its HMAC verdict and records the digest without checking it.)
Files are read and written a MiB at a time, never whole.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, BinaryIO, NamedTuple, Protocol

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import hmac as crypto_hmac
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from torpor.errors import ConfigError, DecryptionError, DigestMismatch, ImageError
from torpor.formats import mediatypes as mt
from torpor.formats.digests import new_hasher, verify_hasher
from torpor.image.encryption_annotations import (
    KEYS_JWE,
    PUBOPTS,
    LayerKey,
    expected_hmac,
    layer_recipients,
    open_layer_key,
    sealed_annotations,
)
from torpor.image.encryption_keys import DecryptionKey, Recipient

__all__ = ["ENCRYPTED_SUFFIX", "KEYS_JWE", "PUBOPTS", "EncryptedBlob", "PlainBlob", "decrypt_blob",
           "encrypt_blob", "is_encrypted", "layer_recipients"]

ENCRYPTED_SUFFIX = mt.ENCRYPTED_SUFFIX
CHUNK = 1 << 20


class _Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...


class EncryptedBlob(NamedTuple):
    media_type: str
    digest: str
    size: int
    annotations: dict[str, str]  # the two ocicrypt annotations to add to the layer's descriptor


class PlainBlob(NamedTuple):
    media_type: str
    digest: str
    size: int


def is_encrypted(media_type: str) -> bool:
    return media_type.endswith(ENCRYPTED_SUFFIX)


def encrypt_blob(src_path: str, dst_path: str, media_type: str, recipients: Sequence[Recipient],
                 *, durable: bool = True) -> EncryptedBlob:
    """Encrypt the blob at `src_path` into `dst_path` for `recipients` (at least one)."""
    if not recipients:
        raise ConfigError("encrypting a layer needs at least one recipient (jwe:PUBKEY.pem)")
    if is_encrypted(media_type):
        raise ImageError(f"{src_path} is already encrypted ({media_type})")
    key, nonce = os.urandom(32), os.urandom(16)
    plain_hasher, cipher_hasher = hashlib.sha256(), hashlib.sha256()
    with open(src_path, "rb", buffering=0) as src, _private_output(dst_path, durable) as out:
        size, mac = _ctr_stream(src, out, key, nonce, encrypt=True, plain=plain_hasher, cipher=cipher_hasher)
        layer_key = LayerKey(key, nonce, "sha256:" + plain_hasher.hexdigest())
        annotations = sealed_annotations(layer_key, mac, recipients)
    return EncryptedBlob(media_type + ENCRYPTED_SUFFIX, "sha256:" + cipher_hasher.hexdigest(), size,
                         annotations)


def decrypt_blob(src_path: str, dst_path: str, descriptor: Mapping[str, Any],
                 private_keys: Sequence[DecryptionKey], *, durable: bool = True) -> PlainBlob:
    """Decrypt the blob at `src_path` (whose OCI descriptor is `descriptor`) into `dst_path`."""
    with open(src_path, "rb", buffering=0) as src, _private_output(dst_path, durable) as out:
        return decrypt_stream(src, out, descriptor, private_keys, src_path)


def decrypt_stream(src: io.RawIOBase, out: BinaryIO, descriptor: Mapping[str, Any],
                   private_keys: Sequence[DecryptionKey], where: str = "",
                   keys_from: str = "") -> PlainBlob:
    """Decrypt `src` (whose OCI descriptor is `descriptor`) into `out`, a private file the
    caller drops unless this returns: every check is made at the end, after the last byte."""
    media_type = str(descriptor.get("mediaType", ""))
    layer = f"layer {descriptor.get('digest') or where}"
    if not is_encrypted(media_type):
        raise ImageError(f"{layer} is not encrypted (media type {media_type or 'missing'})")
    annotations = descriptor.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise ImageError(f"{layer}: its annotations are not an object")
    mac_expected = expected_hmac(layer, annotations)
    key, nonce, recorded = open_layer_key(layer, annotations, private_keys, keys_from)
    algorithm = recorded.partition(":")[0] if recorded else "sha256"
    plain_hasher = hashlib.new(algorithm)
    digest_expected, size_expected = descriptor.get("digest"), descriptor.get("size")
    cipher_hasher = new_hasher(digest_expected) if isinstance(digest_expected, str) else None
    size, mac = _ctr_stream(src, out, key, nonce, encrypt=False, plain=plain_hasher,
                            cipher=cipher_hasher)
    if isinstance(size_expected, int) and size != size_expected:
        raise DigestMismatch(f"{layer} is {size} bytes, its descriptor says {size_expected}: "
                             "truncated or damaged; nothing decrypted was kept")
    if cipher_hasher is not None and isinstance(digest_expected, str):
        verify_hasher(cipher_hasher, digest_expected, layer)
    if not hmac.compare_digest(mac, mac_expected):
        raise DecryptionError(f"{layer} fails its HMAC check: the encrypted blob was altered, "
                              "truncated or corrupted; nothing decrypted was kept")
    digest = f"{algorithm}:{plain_hasher.hexdigest()}"
    if recorded and digest != recorded:
        raise DigestMismatch(f"{layer} decrypts to {digest}, not to {recorded} that its sealed "
                             "options record; nothing decrypted was kept")
    return PlainBlob(media_type.removesuffix(ENCRYPTED_SUFFIX), digest, size)


def _ctr_stream(src: io.RawIOBase, out: BinaryIO, key: bytes, nonce: bytes, *,
                encrypt: bool,
                plain: _Hasher, cipher: _Hasher | None = None) -> tuple[int, bytes]:
    """Stream src through AES-256-CTR into out; (bytes, HMAC-SHA256 of the ciphertext).

    `plain` and `cipher` (hashlib objects) are fed the plaintext and the ciphertext."""
    aes = Cipher(algorithms.AES(key), modes.CTR(nonce))
    context = aes.encryptor() if encrypt else aes.decryptor()
    mac = crypto_hmac.HMAC(key, hashes.SHA256())
    inbuf, outbuf = bytearray(CHUNK), bytearray(CHUNK + 15)  # update_into wants a block spare
    size = 0
    while n := src.readinto(inbuf):
        data = memoryview(inbuf)[:n]
        result = memoryview(outbuf)[:context.update_into(data, outbuf)]
        plaintext, ciphertext = (data, result) if encrypt else (result, data)
        plain.update(plaintext)
        if cipher is not None:
            cipher.update(ciphertext)
        mac.update(ciphertext)
        out.write(result)
        size += n
    context.finalize()
    return size, mac.finalize()


@contextmanager
def _private_output(dst_path: str, durable: bool) -> Iterator[io.BufferedWriter]:
    """A 0600 temporary file beside dst_path, renamed onto it if the block succeeds, else removed."""
    directory, name = os.path.split(os.path.abspath(dst_path))
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=directory)
    try:
        with open(fd, "wb") as out:
            yield out
            out.flush()
            if durable:
                os.fsync(fd)
        os.rename(temporary, dst_path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
