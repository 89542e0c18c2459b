"""Manifests as the registry client meets them: which kind a body is, and parsing it safely."""

from __future__ import annotations

import json

from torpor.errors import ImageError
from torpor.formats.mediatypes import INDEX_TYPES, OCI_INDEX, OCI_MANIFEST
from torpor.formats.oci import OciDocument


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


def parse_manifest(body: bytes, what: str) -> OciDocument:
    """The JSON object of a manifest or index, or ImageError saying which one is malformed."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ImageError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(document, dict):
        raise ImageError(f"{what} is not a JSON object")
    return document
