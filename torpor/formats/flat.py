"""Flat records: frozen dataclasses whose fields are str, int, float, bool (or optional ones),
read from and written to JSON objects by their declared types. Nested records write their own
`from_json`/`to_json` and use these for their flat parts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from torpor.errors import FormatError
from torpor.formats.fields import Fields

T = TypeVar("T")

_READERS: dict[str, Callable[[Fields, str], Any]] = {
    "str": Fields.string, "str | None": Fields.optional_string,
    "int": Fields.integer, "int | None": Fields.optional_integer,
    "float": Fields.number, "bool": Fields.boolean,
}


def from_flat(cls: type[T], fields: Fields) -> T:
    """An instance of the dataclass `cls` from `fields`, each field checked against its type."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        reader = _READERS.get(str(f.type))
        if reader is None:
            raise TypeError(f"{cls.__name__}.{f.name}: {f.type} is not a flat field type")
        has_default = f.default is not dataclasses.MISSING
        if not fields.has(f.name) and has_default:
            kwargs[f.name] = f.default
            continue
        if f.type in ("str", "int", "float", "bool") and not fields.has(f.name):
            raise FormatError(f"{fields.what}: {f.name} is missing")
        kwargs[f.name] = reader(fields, f.name)
    return cls(**kwargs)


def to_flat(record: object) -> dict[str, Any]:
    """The JSON object of a flat dataclass instance (None fields kept as null)."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}  # type: ignore[arg-type]
