"""OCI content descriptors (image-spec descriptor.md): what a manifest, an index or a layout's
index.json says about one blob. The JSON object a descriptor came from is kept whole in `raw`,
so platform, annotations, artifactType and unknown fields travel unchanged."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from torpor.errors import ImageError
from torpor.formats.digests import split_digest


@dataclass(frozen=True)
class Descriptor:
    """A content descriptor; `raw` is the JSON object it came from (platform, annotations...)."""

    media_type: str
    digest: str
    size: int
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def annotations(self) -> dict[str, str]:
        value = self.raw.get("annotations")
        return dict(value) if isinstance(value, dict) else {}

    @property
    def platform(self) -> dict[str, Any] | None:
        value = self.raw.get("platform")
        return value if isinstance(value, dict) else None

    @property
    def artifact_type(self) -> str | None:
        value = self.raw.get("artifactType")
        return value if isinstance(value, str) else None

    @property
    def urls(self) -> list[str]:
        value = self.raw.get("urls")
        return [u for u in value if isinstance(u, str)] if isinstance(value, list) else []

    def to_json(self) -> dict[str, Any]:
        out = dict(self.raw)
        out.update({"mediaType": self.media_type, "digest": self.digest, "size": self.size})
        return out

    @classmethod
    def from_json(cls, value: object, where: str) -> Descriptor:
        if not isinstance(value, dict):
            raise ImageError(f"{where} is not a descriptor object")
        media_type, digest, size = value.get("mediaType"), value.get("digest"), value.get("size")
        if not isinstance(media_type, str) or not media_type:
            raise ImageError(f"{where} has no mediaType")
        if not isinstance(digest, str):
            raise ImageError(f"{where} has no digest")
        split_digest(digest)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ImageError(f"{where} ({digest}) has no valid size")
        return cls(media_type, digest, size, dict(value))


# The two shapes that stay plain dicts across modules, because fields torpor does not know must
# survive byte for byte: an OCI runtime spec (config.json) and an OCI image document (a
# manifest, an index or an image config).
OciSpec = dict[str, Any]
OciDocument = dict[str, Any]


def distinct_blobs(descriptors: Iterable[Descriptor],
                   excluding: Collection[str] = ()) -> list[Descriptor]:
    """Each blob once (by digest, first seen first), none whose digest is in `excluding`: the
    blobs a checkpoint stores are its configs and layers less its base image's
    (docs/generations.md), whichever of build, encryption or inspect counts them."""
    unique = {d.digest: d for d in descriptors if d.digest not in excluding}
    return list(unique.values())


def stored_bytes(descriptors: Iterable[Descriptor], excluding: Collection[str] = ()) -> int:
    """The bytes of `distinct_blobs`: what "stored" means in every figure torpor prints."""
    return sum(d.size for d in distinct_blobs(descriptors, excluding))
