"""torpor checkpoint CONTAINER (-o DIR | -t REF [--push] [--every D --keep N] | -o DIR --oci)."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.durations import duration_option
from torpor.cli.encryption_flags import recipient_option, recipients_from
from torpor.cli.output import Globals, emit_json, human_size
from torpor.cli.registry_flags import access_from, registry_options
from torpor.cli.target_flags import check_target
from torpor.formats.criu import CriuOptions
from torpor.formats.files import VolumePolicy
from torpor.formats.request import CheckpointRequest
from torpor.ops.checkpoint import CheckpointTarget, checkpoint


def parse_volumes(values: tuple[str, ...]) -> VolumePolicy | None:
    items = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if not items:
        return None
    if items in (["all"], ["none"]):
        return items[0]
    if "all" in items or "none" in items:
        raise click.BadParameter("'all' and 'none' stand alone", param_hint="--volumes")
    return tuple(v.rstrip("/") or "/" for v in items)


@click.command("checkpoint")
@click.argument("container")
@click.option("-o", "--output", "directory", metavar="DIR",
              help="Write the checkpoint into this (new or empty) directory.")
@click.option("--oci", is_flag=True,
              help="With -o: write an OCI image layout (what --push sends) instead.")
@click.option("-t", "--tag", "ref", metavar="REF",
              help="Make a checkpoint image REF (kept locally: torpor ls).")
@click.option("--push", is_flag=True, help="Push the image to REF's registry.")
@click.option("--sign", "sign_key", metavar="KEY",
              help="With --push: sign the pushed image with this PEM EC P-256 private key, "
              "as cosign does (default: [image] signing_key).")
@click.option("--leave-running", "-R", is_flag=True, help="Keep the container running.")
@click.option("--tcp-established", is_flag=True, help="Save established TCP connections.")
@click.option("--file-locks", is_flag=True, help="Save file locks.")
@click.option("--ext-unix-sk", is_flag=True, help="Allow external unix sockets.")
@click.option("--shell-job", is_flag=True, help="The container's process is a shell job.")
@click.option("--volumes", multiple=True, metavar="all|none|PATH",
              help="Bind-mounted volumes to save, by destination (repeat or comma-separate); "
              "default: the annotation io.torpor.checkpoint.volumes, else the config (all).")
@click.option("--every", callback=duration_option, metavar="DURATION",
              help="With -t: checkpoint again every DURATION (10m, 1h), leaving the container "
              "running, until SIGTERM; tags REF's tag + time per generation and moves REF's tag "
              "(or latest) along.")
@click.option("--keep", type=click.IntRange(min=0), metavar="N",
              help="With --every: keep the newest N generations (locally, and with --push in "
              "the registry).")
@click.option("--older-than", "older_than", callback=duration_option, metavar="DURATION",
              help="With --every: remove generations older than DURATION.")
@click.option("--rounds", type=click.IntRange(min=1), metavar="N", hidden=True,
              help="With --every: stop after N rounds (torpord runs its schedules one round "
              "at a time); a round that made no generation is an error.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@recipient_option
@registry_options
@click.pass_obj
def checkpoint_command(g: Globals, container: str, directory: str | None, oci: bool,
                       ref: str | None, push: bool, sign_key: str | None,
                       leave_running: bool, tcp_established: bool,
                       file_locks: bool, ext_unix_sk: bool, shell_job: bool,
                       volumes: tuple[str, ...], every: float | None, keep: int | None,
                       older_than: float | None, rounds: int | None, as_json: bool,
                       recipients: tuple[str, ...],
                       username: str | None,
                       password_stdin: bool, ca_file: str | None, insecure: bool) -> None:
    """Checkpoint CONTAINER (processes, memory, GPU, network, files).

    \b
    torpor checkpoint web1 -o DIR            a checkpoint directory
    torpor checkpoint web1 -t REF [--push]   a checkpoint image (pushed to REF's registry)
    torpor checkpoint web1 -o DIR --oci      the image as an OCI image layout
    torpor checkpoint web1 -t REF --every 10m --keep 5 [--push]   periodically
    """
    check_target(directory, oci, ref, push)
    if sign_key and not push:
        raise click.UsageError("--sign signs what is pushed: give -t REF --push")
    if recipients and not (ref or oci):
        raise click.UsageError("--encrypt-recipient encrypts an image: give -t REF or -o DIR --oci")
    request = CheckpointRequest(
        criu=CriuOptions(leave_running=leave_running, tcp_established=tcp_established,
                         file_locks=file_locks, ext_unix_sk=ext_unix_sk, shell_job=shell_job),
        volumes=parse_volumes(volumes))
    target = CheckpointTarget(directory=directory, oci=oci, ref=ref, push=push,
                              registry=access_from(username, password_stdin, ca_file, insecure),
                              recipients=recipients_from(recipients), sign=sign_key)
    if every is not None:
        if not ref or directory:
            raise click.UsageError("--every needs -t REF (and no -o DIR)")
        from torpor.cli.periodic import periodic  # the schedule's modules, only for a series

        periodic(g, container, request, target, every, keep, older_than, as_json, rounds)
        return
    if keep is not None or older_than is not None or rounds is not None:
        raise click.UsageError("--keep, --older-than and --rounds go with --every (or use "
                               "torpor prune)")
    with g.client() as client:
        result = checkpoint(client, container, request, target, config.load(),
                            g.progress(quiet=as_json))
    if as_json:
        emit_json(result.to_json())
        return
    stopped = f" ({container} is stopped)" if result.stopped else ""
    if result.directory:
        sizes = result.sizes
        click.echo(f"checkpointed {container} into {result.directory}: memory "
                   f"{human_size(sizes.memory_pages)}, rootfs changes "
                   f"{human_size(sizes.rootfs_diff)}, total {human_size(sizes.total)} in "
                   f"{result.timings['total_s']:.2f}s{stopped}")
        return
    signed = f", signed in {result.pushed.signature}" if result.pushed and \
        result.pushed.signature else ""
    where = (f"pushed {result.pushed.reference}{signed}" if result.pushed else
             f"image {ref}" if ref else f"OCI layout {directory}")
    added = (f" ({human_size(result.new_bytes)} new on top of {result.previous})"
             if result.previous else "")
    click.echo(f"checkpointed {container}: {where}; {human_size(result.raw_bytes)} of state in "
               f"{human_size(result.compressed_bytes)} stored{added}, "
               f"{result.timings['total_s']:.2f}s{stopped}")


COMMANDS = {"checkpoint": checkpoint_command}
