"""torpor recover: finish what crashed or killed checkpoints left (torpor.ops.recover)."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.output import emit_json, table
from torpor.ops import recover


@click.command("recover")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
def recover_command(as_json: bool) -> None:
    """Finish checkpoints a crashed or killed torpor left.

    A checkpoint that was complete is kept (its container was stopped); one that was not is
    removed, and its container runs on. A dump that may be the only copy of a workload (its
    container is gone: the node rebooted or its processes ended; or its journal was lost) is
    never removed: it is kept, in the checkpoint directory or under the store's kept/, and
    named. Checkpoints still running are left alone.
    """
    done = recover.recover(config.load())
    if as_json:
        emit_json([r.to_json() for r in done])
        return
    if not done:
        click.echo("nothing to recover")
        return
    click.echo(table(["CHECKPOINT", "CONTAINER", "OUTCOME", "DETAIL"],
                     [[r.checkpoint, r.container, r.outcome, r.detail] for r in done]))


COMMANDS = {"recover": recover_command}
