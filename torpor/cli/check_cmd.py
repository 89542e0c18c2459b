"""torpor check [REF]: would a checkpoint and a restore work here now? Each requirement, what
fixes a failure, and a verdict (exit status 1 when not ready)."""

from __future__ import annotations

import click

from torpor.cli.output import Globals, emit_json, table
from torpor.cli.registry_flags import access_from, registry_options
from torpor.ops import check as check_lib

MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "-"}


@click.command()
@click.argument("ref", required=False, metavar="[REF]")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@registry_options
@click.pass_context
def check(ctx: click.Context, ref: str | None, as_json: bool, username: str | None,
          password_stdin: bool, ca_file: str | None, insecure: bool) -> None:
    """Would a checkpoint and a restore work here now? containerd at --address, the torpor
    runtime in its config, the shim launcher and torpor-runc where containerd finds them, the
    runc and CRIU that runtime runs, cgroups, GPUs; with REF, pushing to its registry."""
    g: Globals = ctx.obj
    reqs, verdict = check_lib.run(address=g.address, namespace=g.namespace, ref=ref,
                                  access=access_from(username, password_stdin, ca_file,
                                                     insecure))
    if as_json:
        emit_json(check_lib.as_json(reqs, verdict))
    else:
        click.echo(table(["REQUIREMENT", "STATUS", "DETAIL"],
                         [[r.name, MARK[r.status], r.detail] for r in reqs]))
        fixes = [f"  {r.name}: {r.fix}" for r in reqs if r.status == "fail" and r.fix]
        if fixes:
            click.echo("\nto fix:\n" + "\n".join(fixes))
        click.echo(f"\nverdict: {verdict}")
    ctx.exit(0 if verdict == "ready" else 1)


COMMANDS = {"check": check}
