"""The times torpor writes into checkpoints (RFC 3339, UTC, to the millisecond: two
generations made within one second are still told apart, and ordered) and reads back (with or
without the fraction, as older checkpoints and other tools write them)."""

from __future__ import annotations

import calendar
import time

SECONDS = "%Y-%m-%dT%H:%M:%S"


def now(when: float | None = None) -> str:
    """`when` (default: now) as 2026-12-04T18:39:37.123Z."""
    when = time.time() if when is None else when
    millis = round(when * 1000)
    return f"{time.strftime(SECONDS, time.gmtime(millis // 1000))}.{millis % 1000:03d}Z"


def epoch(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 UTC time ('Z'), fraction or none; None when it
    is not one."""
    if not text.endswith("Z"):
        return None
    whole, _, fraction = text[:-1].partition(".")
    try:
        seconds = float(calendar.timegm(time.strptime(whole, SECONDS)))
        return seconds + (float(f"0.{fraction}") if fraction else 0.0)
    except (ValueError, OverflowError):
        return None


def order(text: str) -> float:
    """A sort key: the time, or before every time for what is none."""
    found = epoch(text)
    return found if found is not None else float("-inf")
