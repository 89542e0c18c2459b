"""What every torpor command gets from the top-level options (Globals), how it reports progress
(StepReporter) and prints results (tables, sizes, JSON)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from torpor.reporting import ByteProgress

if TYPE_CHECKING:
    from torpor.containerd.client import Client


@dataclass
class Globals:
    address: str
    namespace: str
    debug: bool = False
    started: float = field(default_factory=time.monotonic)

    def client(self) -> Client:
        from torpor.containerd.client import Client

        return Client(self.address, self.namespace)

    def progress(self, quiet: bool = False) -> StepReporter:
        """A step reporter on stderr: `[ 1.2s] checkpointing the task ...`."""
        return StepReporter(self.started, quiet)


class StepReporter:
    """torpor.reporting.Progress on a terminal: steps as lines on stderr; byte transfers as one
    line updated in place."""

    def __init__(self, started: float, quiet: bool) -> None:
        self.started, self.quiet = started, quiet
        self.tty = sys.stderr.isatty() and not quiet

    def step(self, message: str) -> None:
        if not self.quiet:
            click.echo(f"[{time.monotonic() - self.started:5.1f}s] {message}", err=True)

    def transfer(self, label: str) -> ByteProgress | None:
        """A (done, total) callback drawing `label 120.0 MiB / 1.0 GiB  11%`, or None."""
        if not self.tty:
            return None
        last = [0.0]

        def draw(done: int, total: int) -> None:
            now = time.monotonic()
            if done < total and now - last[0] < 0.1:
                return
            last[0] = now
            percent = 100 * done // total if total else 100
            end = "\n" if done >= total else ""
            sys.stderr.write(f"\r        {label} {human_size(done)} / {human_size(total)} "
                             f"{percent:3d}%{end}")
            sys.stderr.flush()
        return draw


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def is_tty() -> bool:
    return sys.stderr.isatty()
