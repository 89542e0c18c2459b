"""Can this node's GPUs take a checkpoint's GPU state? Placeholder, see issue 5."""

from __future__ import annotations

from typing import Any


def mismatches(recorded: dict[str, Any] | None, current: dict[str, Any] | None) -> list[str]:
    return []


def uuid_pairs(recorded: dict[str, Any] | None,
               current: dict[str, Any] | None) -> list[tuple[str, str]] | None:
    return None
