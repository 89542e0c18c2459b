"""Durations on the command line: `90s`, `10m`, `1h30m`, `7d` (a bare number is seconds)."""

from __future__ import annotations

import re

import click

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> float:
    """Seconds in `text`; ValueError when it is not a duration."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 10m, 1h30m, 7d)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def duration_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A click option callback: the option's value in seconds."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None
