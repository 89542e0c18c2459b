"""torpor push SOURCE [REF]: a local checkpoint to a registry."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.encryption_flags import recipient_option, recipients_from
from torpor.cli.output import Globals, emit_json, human_size
from torpor.cli.registry_flags import access_from, registry_options
from torpor.ops.push import push


@click.command("push")
@click.argument("source", metavar="SOURCE")
@click.argument("ref", required=False, metavar="[REF]")
@click.option("--sign", "sign_key", metavar="KEY",
              help="Sign the pushed image with this PEM EC P-256 private key, as cosign does "
              "(default: [image] signing_key).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@recipient_option
@registry_options
@click.pass_obj
def push_command(g: Globals, source: str, ref: str | None, sign_key: str | None, as_json: bool,
                 recipients: tuple[str, ...], username: str | None, password_stdin: bool,
                 ca_file: str | None, insecure: bool) -> None:
    """Push a checkpoint (a local image, a checkpoint directory or an OCI layout) to REF."""
    with g.client() as client:
        result = push(client, source, ref or source, config.load(),
                      access_from(username, password_stdin, ca_file, insecure),
                      g.progress(quiet=as_json), recipients_from(recipients), sign_key)
    if as_json:
        emit_json(result.to_json())
        return
    click.echo(f"pushed {result.reference}: {result.uploaded} blobs uploaded "
               f"({human_size(result.bytes_uploaded)}), {result.mounted} mounted, "
               f"{result.existing} already there"
               + (f"; signed in {result.signature}" if result.signature else ""))


COMMANDS = {"push": push_command}
