"""JSON for the processes that run on every container operation (torpor-runc, torpor-hook).

`import json` costs ~8 ms here, most of it `re` and `enum`, which json.decoder and json.encoder
import at module level; CPython's own C scanner and encoder in `_json` need neither. These two
functions drive `_json` directly, with the json module's defaults (strict parsing, compact
output without ASCII escaping), and fall back to `json` where `_json` is missing.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:  # pragma: no cover - CPython always has it
    _json = None  # type: ignore[assignment]

_WHITESPACE = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Context:
    """The attributes `_json.make_scanner` reads from json.JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__
    memo: dict[str, str] = {}


class DecodeError(ValueError):
    pass


def loads(data: str | bytes) -> Any:
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    if _json is None:
        import json

        return json.loads(text)
    start, end = 0, len(text)
    while start < end and text[start] in _WHITESPACE:
        start += 1
    while end > start and text[end - 1] in _WHITESPACE:
        end -= 1
    scanner = _json.make_scanner(_Context())  # type: ignore[arg-type]
    try:
        value, stop = scanner(text[:end], start)
    except Exception:  # invalid JSON: the json module says precisely where and why
        import json

        return json.loads(text)
    if stop != end:
        raise DecodeError(f"extra data at character {stop}")
    return value


def _default(obj: object) -> object:
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def dumps(obj: Any) -> str:
    """Compact JSON (separators ',' and ':'), UTF-8 kept as is, like json.dumps(ensure_ascii=False)."""
    if _json is None:
        import json

        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    encoder = _json.make_encoder({}, _default, _json.encode_basestring, None, ":", ",", False,
                                 False, True)
    return "".join(encoder(obj, 0))
