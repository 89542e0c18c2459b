"""torpor recover: finish what crashed or killed checkpoints left (torpor.ops.recover)."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.output import Globals, emit_json, table
from torpor.errors import ContainerdError
from torpor.ops import own_files, recover


@click.command("recover")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
@click.pass_obj
def recover_command(g: Globals, as_json: bool) -> None:
    """Finish checkpoints a crashed or killed torpor left.

    A checkpoint that was complete is kept (its container was stopped); one that was not is
    removed, and its container runs on. A dump that may be the only copy of a workload (its
    container is gone: the node rebooted or its processes ended; or its journal was lost) is
    never removed: it is kept, in the checkpoint directory or under the store's kept/, and
    named. Checkpoints still running are left alone. The sandbox files restores made for
    containers that are gone (deleted with ctr, nerdctl or the kubelet) are removed.
    """
    cfg = config.load()
    done = recover.recover(cfg)
    try:
        with g.client() as client:
            swept = own_files.sweep(client, cfg)
    except ContainerdError as e:   # containerd away: its containers' files stay
        swept = []
        click.echo(f"torpor: warning: restored containers' files not looked at: {e}", err=True)
    done += [recover.Recovered("-", "", "removed",
                               f"{path}: sandbox files of a restored container that is gone")
             for path in swept]
    if as_json:
        emit_json([r.to_json() for r in done])
        return
    if not done:
        click.echo("nothing to recover")
        return
    click.echo(table(["CHECKPOINT", "CONTAINER", "OUTCOME", "DETAIL"],
                     [[r.checkpoint, r.container, r.outcome, r.detail] for r in done]))


COMMANDS = {"recover": recover_command}
