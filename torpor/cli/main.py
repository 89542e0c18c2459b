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
from torpor import tally
from torpor.cli.output import Globals
from torpor.errors import TorporError

# verb -> its module (one per verb), imported only when that verb runs, and its line in
# `torpor --help` (so that the list costs no import; tests/unit/test_cli_help.py keeps them true)
LAZY_COMMANDS = {
    "checkpoint": ("torpor.cli.checkpoint_cmd",
                   "Checkpoint a container to a directory, image or registry."),
    "restore": ("torpor.cli.restore_cmd",
                "Restore a container from a directory, image or archive."),
    "push": ("torpor.cli.push_cmd", "Push a checkpoint to a registry."),
    "pull": ("torpor.cli.pull_cmd", "Pull a checkpoint image into the local store."),
    "import": ("torpor.cli.import_cmd", "Import a checkpoint made by nerdctl or ctr."),
    "inspect": ("torpor.cli.inspect_cmd", "Show what a checkpoint holds."),
    "ls": ("torpor.cli.ls_cmd", "List the local checkpoint images."),
    "rm": ("torpor.cli.rm_cmd", "Delete local checkpoint images."),
    "prune": ("torpor.cli.prune_cmd", "Remove old checkpoint generations."),
    "schedule": ("torpor.cli.schedule_cmd", "Periodic checkpoints run by torpord."),
    "estimate": ("torpor.cli.estimate_cmd",
                 "Estimate a container's next checkpoint, without taking it."),
    "recover": ("torpor.cli.recover_cmd", "Finish checkpoints a crashed torpor left."),
    "check": ("torpor.cli.check_cmd", "Check this node: containerd, runc, CRIU, cgroups, GPUs."),
    "runtime-config": ("torpor.cli.runtime_config_cmd",
                       "Print or install the engine configuration for torpor-runc."),
    "kube": ("torpor.cli.kube_cmd", "Kubernetes: kubelet's archives, images, pod migration."),
}


class TorporGroup(click.Group):
    """Loads heavy commands on first use and turns torpor errors into one clear line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS:
            module = __import__(LAZY_COMMANDS[name][0], fromlist=["COMMANDS"])
            command: click.Command | None = module.COMMANDS.get(name)
            return command
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, LAZY_COMMANDS[name][1]) for name in sorted(LAZY_COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TorporError as e:
            tally.failed(type(e).__name__)   # torpord counts failures by what ended them
            if _debug(ctx):
                raise
            click.echo(f"torpor: error: {e}", err=True)
            ctx.exit(e.exit_code)
        except OSError as e:  # a file or device the system refused: say which, not a traceback
            tally.failed("OSError")
            if _debug(ctx):
                raise
            where = f": {e.filename}" if e.filename else ""
            click.echo(f"torpor: error: {e.strerror or e}{where}", err=True)
            ctx.exit(1)
        except (click.ClickException, KeyboardInterrupt) as e:   # click reports these itself
            tally.failed(type(e).__name__)
            raise


def _debug(ctx: click.Context) -> bool:
    """--debug was given (ctx.obj exists once the group's options are parsed)."""
    return ctx.obj is not None and bool(getattr(ctx.obj, "debug", False))


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
