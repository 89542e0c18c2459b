"""torpor checkpoint CONTAINER -o DIR: processes, memory, GPU, network and files."""

from __future__ import annotations

import click

from torpor import config
from torpor.checkpointer import CheckpointOptions, checkpoint
from torpor.cli.context import Globals, emit_json, human_size


def parse_volumes(values: tuple[str, ...]) -> str | list[str] | None:
    items = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if not items:
        return None
    if items in (["all"], ["none"]):
        return items[0]
    if "all" in items or "none" in items:
        raise click.BadParameter("'all' and 'none' stand alone", param_hint="--volumes")
    return items


@click.command("checkpoint")
@click.argument("container")
@click.option("-o", "--output", "directory", required=True, metavar="DIR",
              help="Write the checkpoint into this (new or empty) directory.")
@click.option("--leave-running", "-R", is_flag=True, help="Keep the container running.")
@click.option("--tcp-established", is_flag=True, help="Save established TCP connections.")
@click.option("--file-locks", is_flag=True, help="Save file locks.")
@click.option("--ext-unix-sk", is_flag=True, help="Allow external unix sockets.")
@click.option("--shell-job", is_flag=True, help="The container's process is a shell job.")
@click.option("--volumes", multiple=True, metavar="all|none|PATH",
              help="Bind-mounted volumes to save, by destination (repeat or comma-separate); "
              "default: the annotation io.torpor.checkpoint.volumes, else the config (all).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def checkpoint_command(g: Globals, container: str, directory: str, leave_running: bool,
                       tcp_established: bool, file_locks: bool, ext_unix_sk: bool,
                       shell_job: bool, volumes: tuple[str, ...], as_json: bool) -> None:
    """Checkpoint CONTAINER (processes, memory, GPU, network, files) into DIR."""
    options = CheckpointOptions(leave_running=leave_running, tcp_established=tcp_established,
                                file_locks=file_locks, ext_unix_sk=ext_unix_sk,
                                shell_job=shell_job, volumes=parse_volumes(volumes))
    with g.client() as client:
        metadata = checkpoint(client, container, directory, options, config.load(),
                              progress=g.progress(quiet=as_json))
    if as_json:
        emit_json({"directory": directory, "container": container,
                   "sizes": metadata["sizes"], "timings": metadata["timings"]})
        return
    sizes = metadata["sizes"]
    click.echo(f"checkpointed {container} into {directory}: memory "
               f"{human_size(sizes['memory_pages'])}, rootfs changes "
               f"{human_size(sizes['rootfs_diff'])}, total {human_size(sizes['total'])} in "
               f"{metadata['timings']['total_s']:.2f}s"
               + ("" if leave_running else f" ({container} is stopped)"))


COMMANDS = {"checkpoint": checkpoint_command}
