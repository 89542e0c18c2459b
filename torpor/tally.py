"""What this process's operations moved, in bytes, and why its command failed: for whoever
counts them (torpord's metrics, torpor/service/metrics.py), kept here because the library
cannot know its caller.

    written     checkpoint state written on this node: a checkpoint directory's files, or the
                blobs an image added to what its previous generation held
    pushed      bytes uploaded to a registry (checkpoint --push, push)
    downloaded  bytes fetched from a registry (restore, pull; a lazy restore's range reads)
    local       checkpoint bytes a restore took from this node: blobs the image store already
                held, a local image's or layout's layers, a directory's or archive's files

Operations add what they moved once they are done (a failed one adds nothing); the CLI notes
the error that ended a command. `report()` is the record a torpord child sends its service:
one JSON line, short enough to be written to a pipe in one atomic write. Stdlib only: the
torpor-runc fast path may import it.
"""

from __future__ import annotations

import json

KINDS = ("written", "pushed", "downloaded", "local")
MAX_REPORT = 4096   # PIPE_BUF on Linux: a write of at most this many bytes is never split

_bytes: dict[str, int] = {}
_error: list[str] = []


def add(kind: str, count: int) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown byte kind {kind!r}")
    if count > 0:
        _bytes[kind] = _bytes.get(kind, 0) + count


def failed(error: str) -> None:
    """The command ended with this error: a torpor error class's name (RestoreError), OSError,
    UsageError; the first one noted stands."""
    if not _error:
        _error.append(error[:64])


def reset() -> None:
    _bytes.clear()
    _error.clear()


def report() -> bytes:
    """{"bytes": {kind: n}, "error": name} as one line of at most MAX_REPORT bytes."""
    line = json.dumps({"bytes": dict(_bytes), "error": _error[0] if _error else ""},
                      separators=(",", ":")).encode() + b"\n"
    return line if len(line) <= MAX_REPORT else b"{}\n"


def parse_report(data: bytes) -> tuple[dict[str, int], str]:
    """The byte counts and the error of a child's report; ({}, "") for none, a cut one or a
    garbled one (a child killed before it wrote, or writing something else)."""
    try:
        message = json.loads(data.split(b"\n", 1)[0] or b"{}")
    except ValueError:
        return {}, ""
    if not isinstance(message, dict):
        return {}, ""
    raw, error = message.get("bytes"), message.get("error")
    counts = {k: v for k, v in raw.items() if k in KINDS and isinstance(v, int)
              and not isinstance(v, bool) and v > 0} if isinstance(raw, dict) else {}
    return counts, error if isinstance(error, str) else ""
