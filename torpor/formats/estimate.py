"""A storage estimate (`torpor estimate NAME`): how many bytes a full checkpoint of a running
container would store, and how many the next one would add to its previous generation, part by
part (memory, read-write layer, volumes, GPU memory, metadata).

Kept as `<state_dir>/estimates/<namespace>/<id>.json`, so that the next checkpoint of that
container records it beside what it really stored (`torpor inspect` shows both).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from torpor.errors import FormatError
from torpor.formats.fields import Fields, check_format
from torpor.formats.flat import from_flat, to_flat

ESTIMATE_FORMAT = "torpor.estimate.v1"


@dataclass(frozen=True)
class EstimatePart:
    name: str          # memory, rootfs, volumes, gpu, metadata
    raw_bytes: int     # what would be saved, uncompressed (zero pages left out)
    full_bytes: int    # stored, compressed, by a full checkpoint
    new_bytes: int     # stored, compressed, by the next checkpoint on top of the previous one
    detail: str = ""   # how it was reckoned, in words


@dataclass(frozen=True)
class Estimate:
    container: str
    namespace: str
    created: str       # UTC, ISO 8601
    previous: str      # the previous generation's image index digest; "" for none
    previous_ref: str  # its reference in the local store
    parts: tuple[EstimatePart, ...]
    seconds: float

    @property
    def full_bytes(self) -> int:
        return sum(p.full_bytes for p in self.parts)

    @property
    def new_bytes(self) -> int:
        return sum(p.new_bytes for p in self.parts)

    def to_json(self) -> dict[str, Any]:
        return {"format": ESTIMATE_FORMAT, "container": self.container,
                "namespace": self.namespace, "created": self.created,
                "previous": self.previous, "previous_ref": self.previous_ref,
                "parts": [to_flat(p) for p in self.parts], "seconds": self.seconds,
                "full_bytes": self.full_bytes, "new_bytes": self.new_bytes}

    @classmethod
    def from_json(cls, f: Fields) -> Estimate:
        check_format(f, ESTIMATE_FORMAT)
        return cls(container=f.string("container"), namespace=f.string("namespace"),
                   created=f.string("created"), previous=f.string("previous", ""),
                   previous_ref=f.string("previous_ref", ""),
                   parts=tuple(from_flat(EstimatePart, p) for p in f.children("parts")),
                   seconds=f.number("seconds", 0.0))

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode()

    @classmethod
    def loads(cls, data: bytes, what: str) -> Estimate:
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise FormatError(f"{what} is not valid JSON: {e}") from None
        return cls.from_json(Fields(document, what))
