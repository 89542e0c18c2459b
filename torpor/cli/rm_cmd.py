"""torpor rm REF...: delete checkpoint images from the local store, and the runnable images
that restores imported into containerd under those names."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.output import Globals
from torpor.errors import ContainerdError
from torpor.ops import store


@click.command("rm")
@click.argument("refs", nargs=-1, required=True, metavar="REF...")
@click.pass_obj
def rm_command(g: Globals, refs: tuple[str, ...]) -> None:
    """Delete local checkpoint images (and the images restores imported into containerd)."""
    cfg = config.load()
    try:
        with g.client() as client:
            from_containerd = store.rm(cfg, list(refs), client)
    except ContainerdError as e:   # containerd away: the store still goes
        store.rm(cfg, [ref for ref in refs if store.has(cfg, ref)])
        from_containerd = []
        click.echo(f"torpor: warning: images in containerd left as they are: {e}", err=True)
    for ref in refs:
        click.echo(f"removed {ref}" + (" (and its image in containerd)"
                                       if ref in from_containerd else ""))


COMMANDS = {"rm": rm_command}
