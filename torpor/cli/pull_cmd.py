"""torpor pull REF [-o DIR]: a checkpoint image into the local store."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.encryption_flags import decryption_key_option, keys_from
from torpor.cli.output import Globals, emit_json, human_size
from torpor.cli.registry_flags import access_from, registry_options
from torpor.ops.pull import pull


@click.command("pull")
@click.argument("ref")
@click.option("-o", "--output", "out", metavar="DIR", help="Into this OCI layout, not the store.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@decryption_key_option
@registry_options
@click.pass_obj
def pull_command(g: Globals, ref: str, out: str | None, as_json: bool,
                 decryption_keys: tuple[str, ...], username: str | None, password_stdin: bool,
                 ca_file: str | None, insecure: bool) -> None:
    """Pull the checkpoint image REF (every layer digest-checked); with --decryption-key, its
    encrypted layers are decrypted in the local copy."""
    result = pull(ref, config.load(), out, access_from(username, password_stdin, ca_file,
                                                       insecure), g.progress(quiet=as_json),
                  keys_from(decryption_keys))
    if as_json:
        emit_json(result.to_json())
        return
    click.echo(f"pulled {result.reference} ({result.container}): {result.downloaded} "
               f"blobs, {human_size(result.bytes_downloaded)} into {result.layout}"
               + (" (encrypted)" if result.encrypted else "") + f"; {result.signature}")


COMMANDS = {"pull": pull_command}
