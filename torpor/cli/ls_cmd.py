"""torpor ls: the checkpoint images in the local store."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.output import emit_json, human_size, table
from torpor.ops import store


@click.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def ls_command(as_json: bool) -> None:
    """List the local checkpoint images."""
    entries = store.ls(config.load())
    if as_json:
        emit_json([e.to_json() for e in entries])
        return
    click.echo(table(["REF", "DIGEST", "SIZE"], [
        [e.ref, e.digest[:19], human_size(e.size)] for e in entries]))


COMMANDS = {"ls": ls_command}
