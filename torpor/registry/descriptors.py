"""What a manifest or index points at.

An index's `manifests` are child manifests (or nested indexes); an image manifest's `config` and
`layers` are blobs. Whatever else a manifest holds (`subject`, annotations, unknown fields) is
kept byte for byte but not followed.
"""

from __future__ import annotations

from dataclasses import dataclass

from torpor.errors import ImageError
from torpor.formats.oci import Descriptor, OciDocument
from torpor.registry import manifests


@dataclass(frozen=True)
class ManifestContents:
    """What one manifest or index refers to."""

    manifests: list[Descriptor]
    config: Descriptor | None
    layers: list[Descriptor]

    @property
    def blobs(self) -> list[Descriptor]:
        return ([self.config] if self.config else []) + self.layers


def manifest_contents(document: OciDocument, media_type: str, what: str) -> ManifestContents:
    """The children of a parsed manifest (`what` names it in errors)."""
    if manifests.is_index(media_type) or "manifests" in document:
        entries = document.get("manifests", [])
        if not isinstance(entries, list):
            raise ImageError(f"{what}: 'manifests' is not a list")
        return ManifestContents(
            [Descriptor.from_json(e, f"{what} manifests[{i}]") for i, e in enumerate(entries)],
            None, [])
    config = None
    if "config" in document:
        config = Descriptor.from_json(document["config"], f"{what} config")
    entries = document.get("layers", [])
    if not isinstance(entries, list):
        raise ImageError(f"{what}: 'layers' is not a list")
    layers = [Descriptor.from_json(e, f"{what} layers[{i}]") for i, e in enumerate(entries)]
    return ManifestContents([], config, layers)
