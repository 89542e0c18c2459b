"""torpor estimate CONTAINER: the size of a checkpoint before taking it."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.output import Globals, emit_json, human_size, table
from torpor.ops.estimate import estimate


@click.command("estimate")
@click.argument("container")
@click.option("--json", "as_json", is_flag=True, help="Print the estimate as JSON.")
@click.pass_obj
def estimate_command(g: Globals, container: str, as_json: bool) -> None:
    """How many bytes a checkpoint of the running CONTAINER would store: in full, and added to
    its previous generation in the local store. The container keeps running; its memory is
    read and hashed as a checkpoint would cut it. The next checkpoint records this estimate
    beside its real figures (torpor inspect)."""
    with g.client() as client:
        result = estimate(client, container, config.load())
    if as_json:
        emit_json(result.to_json())
        return
    click.echo(table(["PART", "RAW", "FULL", "NEXT", ""], [
        [p.name, human_size(p.raw_bytes), human_size(p.full_bytes), human_size(p.new_bytes),
         p.detail] for p in result.parts]))
    against = (f"on top of {result.previous_ref}" if result.previous_ref
               else "no previous generation in the local store: the next one is a full one")
    click.echo(f"a full checkpoint stores about {human_size(result.full_bytes)}; the next one "
               f"adds about {human_size(result.new_bytes)} ({against}); "
               f"estimated in {result.seconds:.2f}s")


COMMANDS = {"estimate": estimate_command}
