"""Signatures in a registry, where cosign keeps them: the `sha256-<hex>.sig` tag of the signed
image's repository (payload.py says what it holds), and the image's OCI 1.1 referrers
(referrers.py).

`read_signatures` fetches those manifests and their payload blobs (each at most 64 KiB,
digest-checked): a few small requests, nothing of the image itself. `write_signature` adds one
signature to it: the signatures other keys made stay, an older one by the same key over the same
digest is replaced.
"""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from torpor.errors import ImageError, RegistryError
from torpor.formats import mediatypes
from torpor.formats.digests import sha256_digest, verify_bytes
from torpor.formats.oci import Descriptor
from torpor.registry import manifests
from torpor.registry.blob_upload import push_blob
from torpor.registry.client import RepositoryClient
from torpor.registry.options import RegistryOptions
from torpor.registry.reference import parse_reference
from torpor.registry.session import RegistrySession
from torpor.signing.keys import SigningKey, TrustedKey
from torpor.signing.payload import (
    MAX_PAYLOAD_BYTES,
    PAYLOAD_MEDIA_TYPE,
    SIGNATURE_ANNOTATION,
    SignatureLayer,
    make_payload,
    signature_layers,
    signature_manifest,
    signature_tag,
)
from torpor.signing.referrers import signature_referrers

SIGNATURE_MANIFEST_LIMIT = 1 << 20


@dataclass(frozen=True)
class FoundSignatures:
    """What the `.sig` tag of a digest holds: readable signatures, and why others are not."""

    where: str                                      # repository:tag (and referrers)
    layers: list[SignatureLayer] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None           # None: no `.sig` tag


@dataclass(frozen=True)
class SignResult:
    reference: str      # the signed image, repository@digest
    signature: str      # where the signature is: repository:sha256-<hex>.sig
    key_id: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_signatures(repo: RepositoryClient, digest: str) -> FoundSignatures:
    """The `.sig` tag's signatures, then the referrers', each once."""
    tag = signature_tag(digest)
    where = f"{repo.repository}:{tag}"
    try:
        fetched = repo.get_manifest(tag, SIGNATURE_MANIFEST_LIMIT)
    except RegistryError as e:
        if e.status != 404:
            raise
        found = FoundSignatures(where)
    else:
        try:
            document = manifests.parse_manifest(fetched.body, f"signature manifest {where}")
        except ImageError as e:
            found = FoundSignatures(where, [], [str(e)], {})
        else:
            found = FoundSignatures(where, manifest=document)
            _read_layers(repo, document, found)
    referrers = signature_referrers(repo, digest, found.unreadable)
    for referrer in referrers:
        _read_layers(repo, referrer, found)
    if referrers:
        found = replace(found, where=f"{where} and {len(referrers)} OCI 1.1 referrer(s)")
    return found


def _read_layers(repo: RepositoryClient, document: dict[str, Any], found: FoundSignatures) -> None:
    seen = {(layer.digest, layer.signature_b64) for layer in found.layers}
    for layer, signature in signature_layers(document):
        if (layer.get("digest"), signature) in seen:
            continue
        same = next((s.payload for s in found.layers if s.digest == layer.get("digest")), None)
        if same is not None:   # another signer of the same payload: fetched once
            found.layers.append(SignatureLayer(same, signature))
            continue
        digest_of, size = layer.get("digest"), layer.get("size")
        if not isinstance(digest_of, str) or not isinstance(size, int) or \
                not 0 <= size <= MAX_PAYLOAD_BYTES:
            found.unreadable.append(f"layer {digest_of}: not a payload of at most "
                                    f"{MAX_PAYLOAD_BYTES} bytes")
            continue
        try:
            body = repo.open_blob(digest_of).read_limited(MAX_PAYLOAD_BYTES)
            verify_bytes(body, digest_of, f"signature payload {digest_of}")
        except (RegistryError, ImageError) as e:
            found.unreadable.append(f"layer {digest_of}: {e}")
            continue
        found.layers.append(SignatureLayer(body, signature))


def decode_signature(layer: SignatureLayer) -> bytes | None:
    try:
        return base64.b64decode(layer.signature_b64, validate=True)
    except (binascii.Error, ValueError):
        return None


def write_signature(repo: RepositoryClient, digest: str, docker_reference: str,
                    key: SigningKey) -> str:
    """Sign `digest` with `key` into its `.sig` tag; returns repository:tag."""
    payload = make_payload(docker_reference, digest)
    signed = SignatureLayer(payload, base64.b64encode(key.sign(payload)).decode())
    existing = read_signatures(repo, digest)
    own_public = key.key.public_key()
    # every signer of one digest signs the same payload: a layer is its payload and signature
    replaced = {(layer.digest, layer.signature_b64) for layer in existing.layers
                if _by(own_public, layer)}
    kept = [d for d in (existing.manifest or {}).get("layers") or []
            if isinstance(d, dict) and (d.get("digest"), (d.get("annotations") or {}).get(
                SIGNATURE_ANNOTATION)) not in replaced]
    config, manifest = signature_manifest([signed], kept)
    with tempfile.TemporaryDirectory(prefix="torpor-sign-") as work:
        for blob, media_type in ((payload, PAYLOAD_MEDIA_TYPE), (config, mediatypes.OCI_CONFIG)):
            path = Path(work) / sha256_digest(blob).split(":")[1]
            path.write_bytes(blob)
            push_blob(repo, path, Descriptor(media_type, sha256_digest(blob), len(blob)), [],
                      lambda _: None)
            os.unlink(path)
    tag = signature_tag(digest)
    repo.put_manifest(tag, manifest, mediatypes.OCI_MANIFEST)
    return f"{repo.repository}:{tag}"


def _by(public: ec.EllipticCurvePublicKey, layer: SignatureLayer) -> bool:
    der = decode_signature(layer)
    return der is not None and TrustedKey("", public).verifies(layer.payload, der)


def sign_with_node_key(reference: str, digest: str, signing_key_path: str,
                       options: RegistryOptions | None = None) -> SignResult | None:
    """Sign a pushed image with `[image] signing_key` (given as `signing_key_path`), if set."""
    if not signing_key_path:
        return None
    from torpor.signing.keys import load_signing_key

    return sign_image(reference, digest, load_signing_key(signing_key_path), options)


def sign_image(reference: str, digest: str, key: SigningKey,
               options: RegistryOptions | None = None) -> SignResult:
    """Sign the image `digest` of `reference`'s repository with `key`, in that repository."""
    ref = parse_reference(reference)
    session = RegistrySession.for_reference(ref, options or RegistryOptions())
    try:
        repo = RepositoryClient(session, session.repository(ref.repository))
        where = write_signature(repo, digest, f"{ref.registry}/{ref.repository}", key)
    finally:
        session.close()
    return SignResult(f"{ref.registry}/{ref.repository}@{digest}", f"{ref.registry}/{where}",
                      key.id)
