"""push, pull, inspect, ls, rm: checkpoints as OCI images (see the image issue)."""

from __future__ import annotations

import click

COMMANDS: dict[str, click.Command] = {}
