"""torpor restore DIR|ARCHIVE|REF [--name NAME]: the container back, with its state."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.encryption_flags import decryption_key_option, keys_from
from torpor.cli.output import Globals, emit_json
from torpor.cli.registry_flags import access_from, registry_options
from torpor.ops.restore import RestoreOptions, restore


def parse_volume_map(values: tuple[str, ...]) -> tuple[dict[str, str], frozenset[str]]:
    """DEST=SOURCE pairs (new host sources), and the DESTs given alone (sources accepted)."""
    mapping, accepted = {}, set()
    for value in values:
        destination, sep, source = value.partition("=")
        if not destination.startswith("/") or (sep and not source.startswith("/")):
            raise click.BadParameter(f"{value!r} is not DEST=SOURCE or DEST (absolute paths)",
                                     param_hint="--volume")
        if sep:
            mapping[destination.rstrip("/") or "/"] = source
        else:
            accepted.add(destination.rstrip("/") or "/")
    return mapping, frozenset(accepted)


@click.command("restore")
@click.argument("source", metavar="DIR|ARCHIVE|REF")
@click.option("--name", help="Restore under this container name (default: the original).")
@click.option("--netns", metavar="PATH",
              help="Restore into this network namespace (e.g. a pod's) instead of a new one.")
@click.option("--add-addresses", is_flag=True,
              help="Add the addresses the checkpointed sockets need to that namespace.")
@click.option("--volume", "volumes", multiple=True, metavar="DEST[=SOURCE]",
              help="Put the volume saved at DEST back into host path SOURCE; DEST alone "
              "accepts the host path the checkpoint names (bind mounts need one or the other, "
              "or [restore] mount_sources).")
@click.option("--allow-spec-hooks", is_flag=True,
              help="Run the hooks the checkpoint's spec names (refused by default; torpor's own "
              "are always this node's).")
@decryption_key_option
@click.option("--log-uri", metavar="URI",
              help="The task's stdout/stderr (file:///path, binary:///path); default a file "
              "under [runtime] log_dir, /var/log/torpor by default.")
@click.option("--runtime-binary", metavar="PATH", help="torpor-runc on this node.")
@click.option("--runc-root", metavar="PATH", default="",
              help="runc's state root for the restored task, as ctr's --runc-root (default: "
              "the runc shim's; a checkpoint's own is never used).")
@click.option("--lazy/--no-lazy", default=None,
              help="Run the workload at once and bring its memory in after it, from this "
              "node's packs or the registry (a checkpoint image only; default [restore] lazy). "
              "The command returns when the last page is in.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@registry_options
@click.pass_obj
def restore_command(g: Globals, source: str, name: str | None, netns: str | None,
                    add_addresses: bool, volumes: tuple[str, ...], allow_spec_hooks: bool,
                    decryption_keys: tuple[str, ...], log_uri: str | None,
                    runtime_binary: str | None, runc_root: str, lazy: bool | None, as_json: bool,
                    username: str | None,
                    password_stdin: bool, ca_file: str | None, insecure: bool) -> None:
    """Restore a container from a checkpoint: a directory, an OCI layout, a kubelet checkpoint
    archive, a local image or an image in a registry (this node is checked before any layer is
    downloaded). Nothing in the
    checkpoint is trusted: its spec's hooks, host mounts, devices, capabilities and namespaces
    must be allowed by this node's [restore] policy or on the command line (torpor inspect
    shows what a restore would grant)."""
    mapping, accepted = parse_volume_map(volumes)
    options = RestoreOptions(name=name, netns=netns, add_addresses=add_addresses,
                             volumes=mapping, accept_mounts=accepted,
                             allow_spec_hooks=allow_spec_hooks,
                             decryption_keys=keys_from(decryption_keys), log_uri=log_uri,
                             runtime_binary=runtime_binary, runc_root=runc_root, lazy=lazy,
                             registry=access_from(username, password_stdin, ca_file, insecure))
    with g.client() as client:
        result = restore(client, source, options, config.load(), g.progress(quiet=as_json))
    if as_json:
        emit_json(result.to_json())
        return
    running_s = result.timings.get("running_s")
    running = "" if running_s is None else (
        f" (running after {running_s:.2f}s, its memory all in after the rest)")
    click.echo(f"restored {result.name} (pid {result.pid}) in "
               f"{result.timings['total_s']:.2f}s{running}; output: {result.log}")


COMMANDS = {"restore": restore_command}
