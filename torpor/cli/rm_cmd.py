"""torpor rm REF...: delete checkpoint images from the local store."""

from __future__ import annotations

import click

from torpor import config
from torpor.ops import store


@click.command("rm")
@click.argument("refs", nargs=-1, required=True, metavar="REF...")
def rm_command(refs: tuple[str, ...]) -> None:
    """Delete local checkpoint images."""
    store.rm(config.load(), list(refs))
    for ref in refs:
        click.echo(f"removed {ref}")


COMMANDS = {"rm": rm_command}
