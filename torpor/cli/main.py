"""The `torpor` command line: checkpoint, restore, push, pull, import, inspect, ls, rm, estimate,
recover, check, runtime-config, kube.

Commands parse options, call one library function and render its result; the library never
imports this package. containerd is found the way ctr finds it: `--address`/`CONTAINERD_ADDRESS`
and `--namespace`/`CONTAINERD_NAMESPACE`.
"""

from __future__ import annotations

import sys
from typing import Any

import click

import torpor
from torpor.cli.output import Globals
from torpor.errors import TorporError

# verb -> its module (one per verb), imported only when that verb runs
LAZY_COMMANDS = {
    "checkpoint": "torpor.cli.checkpoint_cmd",
    "restore": "torpor.cli.restore_cmd",
    "push": "torpor.cli.push_cmd",
    "import": "torpor.cli.import_cmd",
    "pull": "torpor.cli.pull_cmd",
    "inspect": "torpor.cli.inspect_cmd",
    "ls": "torpor.cli.ls_cmd",
    "rm": "torpor.cli.rm_cmd",
    "check": "torpor.cli.check_cmd",
    "runtime-config": "torpor.cli.runtime_config_cmd",
    "kube": "torpor.cli.kube_cmd",
    "recover": "torpor.cli.recover_cmd",
    "estimate": "torpor.cli.estimate_cmd",
    "prune": "torpor.cli.prune_cmd",
}


class TorporGroup(click.Group):
    """Loads heavy commands on first use and turns torpor errors into one clear line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx),
                       *(n for n in LAZY_COMMANDS if self.get_command(ctx, n) is not None)})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS:
            module = __import__(LAZY_COMMANDS[name], fromlist=["COMMANDS"])
            command: click.Command | None = module.COMMANDS.get(name)
            return command
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TorporError as e:
            if ctx.obj is not None and getattr(ctx.obj, "debug", False):
                raise
            click.echo(f"torpor: error: {e}", err=True)
            ctx.exit(e.exit_code)
        except OSError as e:  # a file or device the system refused: say which, not a traceback
            if ctx.obj is not None and getattr(ctx.obj, "debug", False):
                raise
            where = f": {e.filename}" if e.filename else ""
            click.echo(f"torpor: error: {e.strerror or e}{where}", err=True)
            ctx.exit(1)


@click.group(cls=TorporGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--address", "-a", envvar="CONTAINERD_ADDRESS", show_envvar=True,
              default="/run/containerd/containerd.sock", show_default=True,
              help="containerd's gRPC socket.")
@click.option("--namespace", "-n", envvar="CONTAINERD_NAMESPACE", show_envvar=True,
              default="default", show_default=True, help="containerd namespace.")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(torpor.__version__, prog_name="torpor")
@click.pass_context
def cli(ctx: click.Context, address: str, namespace: str, debug: bool) -> None:
    """Checkpoint, ship and restore whole containers under containerd."""
    ctx.obj = Globals(address=address, namespace=namespace, debug=debug)




def main() -> int:
    try:
        cli.main(prog_name="torpor", standalone_mode=True)
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
