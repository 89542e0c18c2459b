"""torpor ls: the checkpoint images in the local store, and the lazy restores under way."""

from __future__ import annotations

from dataclasses import asdict

import click

from torpor import config
from torpor.cli.output import emit_json, human_size, table
from torpor.lazy import progress as lazy_progress
from torpor.ops import store


@click.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.option("--restores", is_flag=True,
              help="Only the lazy restores under way: how much of each one's memory is in.")
def ls_command(as_json: bool, restores: bool) -> None:
    """List the local checkpoint images, and the lazy restores whose memory is arriving."""
    cfg = config.load()
    arriving = lazy_progress.current(cfg.runtime_state_dir)
    if restores:
        if as_json:
            emit_json([dict(asdict(p), fraction=p.fraction) for p in arriving])
        else:
            click.echo(restores_table(arriving))
        return
    entries = store.ls(cfg)
    if as_json:
        emit_json([e.to_json() for e in entries])
        return
    click.echo(table(["REF", "DIGEST", "SIZE"], [
        [e.ref, e.digest[:19], human_size(e.size)] for e in entries]))
    if arriving:
        click.echo(f"\nlazy restores under way:\n{restores_table(arriving)}")


def restores_table(arriving: list[lazy_progress.LazyProgress]) -> str:
    return table(["CONTAINER", "NAMESPACE", "MEMORY IN", "FETCHED", "RUNNING FOR", "FROM"], [
        [p.container, p.namespace,
         f"{human_size(p.placed_bytes)} of {human_size(p.lazy_bytes)} ({p.fraction:.0%})",
         human_size(p.remote_bytes), f"{lazy_progress.since(p):.0f}s", p.source]
        for p in arriving])


COMMANDS = {"ls": ls_command}
