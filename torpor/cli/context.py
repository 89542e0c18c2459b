"""What every torpor command gets from the top-level options, and the output helpers."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import click


@dataclass
class Globals:
    address: str
    namespace: str
    debug: bool = False
    started: float = field(default_factory=time.monotonic)

    def client(self) -> Any:
        from torpor.shim.containerd.client import Client

        return Client(self.address, self.namespace)

    def progress(self, quiet: bool = False) -> Any:
        """A step reporter on stderr: `[ 1.2s] checkpointing the task ...`."""
        def report(step: str) -> None:
            if not quiet:
                elapsed = time.monotonic() - self.started
                click.echo(f"[{elapsed:5.1f}s] {step}", err=True)
        return report


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
