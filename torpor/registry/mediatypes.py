"""Media types torpor must tell apart; every other type is an opaque blob, copied as is."""

from __future__ import annotations

import json
from typing import Any

from torpor.errors import ImageError

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_LAYOUT_VERSION = '{"imageLayoutVersion":"1.0.0"}'

INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
IMAGE_MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
MANIFEST_TYPES = INDEX_TYPES | IMAGE_MANIFEST_TYPES

# The Accept header of every manifest GET: distribution returns 404 for an OCI manifest unless
# the OCI types are listed (notes/formats.md §3.2).
MANIFEST_ACCEPT = ", ".join([OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST])


def is_index(media_type: str) -> bool:
    return media_type in INDEX_TYPES


def manifest_media_type(body: bytes, declared: str | None = None) -> str:
    """The media type to send and store a manifest under: the descriptor's, else the body's own
    `mediaType`, else OCI index or manifest by shape."""
    if declared:
        return declared
    document = parse_manifest(body, "manifest")
    own = document.get("mediaType")
    if isinstance(own, str) and own:
        return own
    return OCI_INDEX if "manifests" in document else OCI_MANIFEST


def parse_manifest(body: bytes, what: str) -> dict[str, Any]:
    """The JSON object of a manifest or index, or ImageError saying which one is malformed."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ImageError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(document, dict):
        raise ImageError(f"{what} is not a JSON object")
    return document
