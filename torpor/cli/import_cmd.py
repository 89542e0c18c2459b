"""torpor import CONTAINER CHECKPOINT: a checkpoint nerdctl made, as a torpor checkpoint."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.encryption_flags import recipient_option, recipients_from
from torpor.cli.output import Globals, emit_json, human_size
from torpor.cli.registry_flags import access_from, registry_options
from torpor.cli.target_flags import check_target
from torpor.containerd.nerdctl import DATA_ROOT
from torpor.ops.checkpoint import CheckpointTarget
from torpor.ops.nerdctl_import import import_checkpoint


@click.command("import")
@click.argument("container")
@click.argument("checkpoint")
@click.option("-o", "--output", "directory", metavar="DIR",
              help="Write a torpor checkpoint directory (new or empty).")
@click.option("--oci", is_flag=True, help="With -o: write an OCI image layout instead.")
@click.option("-t", "--tag", "ref", metavar="REF",
              help="Make a checkpoint image REF (kept locally: torpor ls).")
@click.option("--push", is_flag=True, help="Push the image to REF's registry.")
@click.option("--data-root", default=DATA_ROOT, show_default=True, metavar="DIR",
              help="nerdctl's --data-root (where its checkpoints are).")
@click.option("--checkpoint-dir", metavar="DIR",
              help="nerdctl's --checkpoint-dir, if `nerdctl checkpoint create` had one.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@recipient_option
@registry_options
@click.pass_obj
def import_command(g: Globals, container: str, checkpoint: str, directory: str | None,
                   oci: bool, ref: str | None, push: bool, data_root: str,
                   checkpoint_dir: str | None, as_json: bool, recipients: tuple[str, ...],
                   username: str | None, password_stdin: bool, ca_file: str | None,
                   insecure: bool) -> None:
    """Import CHECKPOINT, made by `nerdctl checkpoint create CONTAINER CHECKPOINT` of a container
    run under torpor-runc (`nerdctl run --runtime /path/to/torpor-runc`), as a torpor checkpoint
    that `torpor push` and `torpor restore` take to any node. CONTAINER must still exist; give
    nerdctl's --address and --namespace (or CONTAINERD_ADDRESS and CONTAINERD_NAMESPACE).

    \b
    torpor import web1 ck1 -o DIR            a checkpoint directory
    torpor import web1 ck1 -t REF [--push]   a checkpoint image (pushed to REF's registry)
    torpor import web1 /path/to/ck1 -o DIR   CHECKPOINT as a directory
    """
    check_target(directory, oci, ref, push)
    if recipients and not (ref or oci):
        raise click.UsageError("--encrypt-recipient encrypts an image: give -t REF or --oci")
    target = CheckpointTarget(directory=directory, oci=oci, ref=ref, push=push,
                              registry=access_from(username, password_stdin, ca_file, insecure),
                              recipients=recipients_from(recipients))
    with g.client() as client:
        result = import_checkpoint(client, container, checkpoint, target, config.load(),
                                   g.progress(quiet=as_json), data_root=data_root,
                                   checkpoints_in=checkpoint_dir)
    if as_json:
        emit_json(result.to_json())
        return
    where = (f"pushed {result.pushed}" if result.pushed else f"image {ref}" if ref
             else f"OCI layout {directory}" if oci else f"directory {result.directory}")
    click.echo(f"imported {result.checkpoint} ({container}, {human_size(result.sizes.total)}): "
               f"{where} in {result.timings['total_s']:.2f}s")


COMMANDS = {"import": import_command}
