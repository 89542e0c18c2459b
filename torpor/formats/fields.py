"""Reading one JSON object of a torpor format with types checked, and errors that name the file
and the field: `checkpoint.json: container.id must be a string, not 42`.

Every `from_json` in torpor.formats reads through `Fields`, so a damaged or hand-edited file is
refused with a message, never with a KeyError deep inside a restore. Stdlib only.
"""

from __future__ import annotations

from typing import Any

from torpor.errors import FormatError


class Fields:
    """A JSON object being read; `what` names it in errors (a file, or file + path)."""

    __slots__ = ("data", "what")

    def __init__(self, data: object, what: str) -> None:
        if not isinstance(data, dict):
            raise FormatError(f"{what} must be a JSON object, not {_kind(data)}")
        self.data: dict[str, Any] = data
        self.what = what

    def _get(self, key: str, kinds: type | tuple[type, ...], name: str, optional: bool) -> Any:
        value = self.data.get(key)
        if value is None:
            if optional:
                return None
            raise FormatError(f"{self.what}: {key} is missing")
        if not isinstance(value, kinds) or (isinstance(value, bool) and kinds in (int, float)):
            raise FormatError(f"{self.what}: {key} must be {name}, not {_kind(value)}")
        return value

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def string(self, key: str, default: str | None = None) -> str:
        value = self._get(key, str, "a string", default is not None)
        return default if value is None and default is not None else str(value)

    def optional_string(self, key: str) -> str | None:
        value = self._get(key, str, "a string", True)
        return None if value is None else str(value)

    def integer(self, key: str, default: int | None = None) -> int:
        value = self._get(key, int, "an integer", default is not None)
        return default if value is None and default is not None else int(value)

    def optional_integer(self, key: str) -> int | None:
        value = self._get(key, int, "an integer", True)
        return None if value is None else int(value)

    def number(self, key: str, default: float | None = None) -> float:
        value = self._get(key, (int, float), "a number", default is not None)
        return default if value is None and default is not None else float(value)

    def boolean(self, key: str, default: bool | None = None) -> bool:
        value = self._get(key, bool, "true or false", default is not None)
        return default if value is None and default is not None else bool(value)

    def child(self, key: str) -> Fields:
        return Fields(self._get(key, dict, "an object", False), f"{self.what}: {key}")

    def optional_child(self, key: str) -> Fields | None:
        value = self._get(key, dict, "an object", True)
        return None if value is None else Fields(value, f"{self.what}: {key}")

    def children(self, key: str) -> list[Fields]:
        """A list of objects (missing: empty)."""
        items = self._get(key, list, "a list", True) or []
        return [Fields(item, f"{self.what}: {key}[{i}]") for i, item in enumerate(items)]

    def strings(self, key: str) -> list[str]:
        items = self._get(key, list, "a list", True) or []
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise FormatError(f"{self.what}: {key}[{i}] must be a string, not {_kind(item)}")
        return list(items)

    def labels(self, key: str) -> dict[str, str]:
        """An object of strings (labels, annotations; missing: empty)."""
        value = self._get(key, dict, "an object", True) or {}
        for k, v in value.items():
            if not isinstance(v, str):
                raise FormatError(f"{self.what}: {key}.{k} must be a string, not {_kind(v)}")
        return dict(value)

    def numbers(self, key: str) -> dict[str, float]:
        """An object of numbers (timings; missing: empty)."""
        value = self._get(key, dict, "an object", True) or {}
        for k, v in value.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise FormatError(f"{self.what}: {key}.{k} must be a number, not {_kind(v)}")
        return {k: float(v) for k, v in value.items()}

    def document(self, key: str) -> dict[str, Any]:
        """An object kept as it is (an OCI runtime spec: unknown fields must survive)."""
        value = self._get(key, dict, "an object", True)
        return dict(value) if value is not None else {}

    def documents(self, key: str) -> list[dict[str, Any]]:
        """A list of objects kept as they are (spec mounts)."""
        return [f.data for f in self.children(key)]


def check_format(fields: Fields, expected: str) -> None:
    """Refuse a file of another format or version, in words."""
    found = fields.data.get("format")
    if found != expected:
        raise FormatError(f"{fields.what} has format {found!r}; this torpor reads {expected!r}",
                          hint="a newer torpor wrote it: upgrade torpor on this node"
                          if isinstance(found, str) and found.startswith("torpor.") else None)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
