"""The documents of a cosign signature, as cosign writes and reads them (no I/O here).

A signature says "this key vouches for the image whose top manifest (here: the checkpoint
image's index) has digest D". Its payload is Red Hat's "simple signing" JSON::

    {"critical": {"identity": {"docker-reference": "host/repo"},
                  "image": {"docker-manifest-digest": "sha256:..."},
                  "type": "cosign container image signature"},
     "optional": null}

and the signature is ECDSA P-256 over the payload's bytes (SHA-256), DER, base64. cosign keeps
the signatures of D in the same repository as an OCI image manifest tagged `sha256-<hex>.sig`:
one layer per signature, of media type `application/vnd.dev.cosign.simplesigning.v1+json`,
whose blob is the payload and whose annotation `dev.cosignproject.cosign/signature` is the
base64 signature; its config is a plain OCI image config listing the layers as diff_ids.
A verifier trusts `docker-manifest-digest` only (`docker-reference` is informative: a copy in
another repository keeps its signatures valid).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torpor.errors import FormatError, ImageError
from torpor.formats import mediatypes
from torpor.formats.digests import sha256_digest, split_digest

PAYLOAD_MEDIA_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SIGNATURE_TYPE = "cosign container image signature"
MAX_PAYLOAD_BYTES = 64 << 10
MAX_SIGNATURES = 64
_ZERO_TIME = "0001-01-01T00:00:00Z"   # what cosign's (go-containerregistry's) empty image says


@dataclass(frozen=True)
class SignatureLayer:
    """One signature: its payload (the layer's blob) and the base64 DER signature."""

    payload: bytes
    signature_b64: str

    @property
    def digest(self) -> str:
        return sha256_digest(self.payload)


def signature_tag(digest: str) -> str:
    """The tag cosign keeps the signatures of `digest` under: `sha256-<hex>.sig`."""
    algorithm, hex_part = split_digest(digest)
    return f"{algorithm}-{hex_part}.sig"


def make_payload(docker_reference: str, digest: str) -> bytes:
    """The simple-signing payload for `digest`, in cosign's own field order."""
    split_digest(digest)
    document = {"critical": {"identity": {"docker-reference": docker_reference},
                             "image": {"docker-manifest-digest": digest},
                             "type": SIGNATURE_TYPE},
                "optional": None}
    return json.dumps(document, separators=(",", ":")).encode()


def signed_digest(payload: bytes) -> str:
    """The image digest a payload vouches for; FormatError for anything else."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise FormatError(f"the signature payload is {len(payload)} bytes, more than "
                          f"{MAX_PAYLOAD_BYTES}")
    try:
        document = json.loads(payload)
        critical = document["critical"]
        kind, digest = critical["type"], critical["image"]["docker-manifest-digest"]
    except (ValueError, KeyError, TypeError):
        raise FormatError("the signature payload is not a simple-signing document") from None
    if kind != SIGNATURE_TYPE or not isinstance(digest, str):
        raise FormatError(f"the signature payload's type is {kind!r}, not {SIGNATURE_TYPE!r}")
    try:
        split_digest(digest)
    except ImageError as e:
        raise FormatError(f"the signature payload names {e}") from None
    return digest


def signature_layers(manifest: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """(layer descriptor, base64 signature) of every simple-signing layer of a `.sig` manifest."""
    found = []
    for layer in (manifest.get("layers") or [])[:MAX_SIGNATURES]:
        if not isinstance(layer, dict) or layer.get("mediaType") != PAYLOAD_MEDIA_TYPE:
            continue
        signature = (layer.get("annotations") or {}).get(SIGNATURE_ANNOTATION)
        if isinstance(signature, str) and signature:
            found.append((layer, signature))
    return found


def signature_manifest(layers: Sequence[SignatureLayer],
                       kept: Sequence[dict[str, Any]] = ()) -> tuple[bytes, bytes]:
    """(config, manifest) of a `.sig` image holding `kept` layer descriptors (another signer's,
    unchanged) and then `layers`."""
    descriptors = list(kept) + [
        {"mediaType": PAYLOAD_MEDIA_TYPE, "size": len(s.payload), "digest": s.digest,
         "annotations": {SIGNATURE_ANNOTATION: s.signature_b64}} for s in layers]
    config = json.dumps({
        "architecture": "", "created": _ZERO_TIME,
        "history": [{"created": _ZERO_TIME} for _ in descriptors], "os": "",
        "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descriptors]},
        "config": {}}, separators=(",", ":")).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": mediatypes.OCI_MANIFEST,
        "config": {"mediaType": mediatypes.OCI_CONFIG, "size": len(config),
                   "digest": sha256_digest(config)},
        "layers": descriptors}, separators=(",", ":")).encode()
    return config, manifest
