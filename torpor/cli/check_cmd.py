"""torpor check: report each requirement of this node and a verdict."""

from __future__ import annotations

import click

from torpor.cli.output import emit_json, table
from torpor.ops import check as check_lib

MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "-"}


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def check(ctx: click.Context, as_json: bool) -> None:
    """Check containerd, runc, CRIU, cgroups and GPUs for checkpoint/restore."""
    reqs, verdict = check_lib.run()
    if as_json:
        emit_json(check_lib.as_json(reqs, verdict))
    else:
        click.echo(table(["REQUIREMENT", "STATUS", "DETAIL"],
                         [[r.name, MARK[r.status], r.detail] for r in reqs]))
        click.echo(f"\nverdict: {verdict}")
    ctx.exit(0 if verdict == "ready" else 1)


COMMANDS = {"check": check}
