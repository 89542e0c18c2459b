"""torpor prune [REPOSITORY] --keep N / --older-than D [--registry]: old generations out."""

from __future__ import annotations

import click

from torpor import config
from torpor.cli.durations import duration_option
from torpor.cli.output import Globals, emit_json
from torpor.cli.registry_flags import access_from, given, registry_options
from torpor.ops.prune import Retention, prune


@click.command("prune")
@click.argument("repository", required=False, metavar="[REPOSITORY]")
@click.option("--keep", type=click.IntRange(min=0), metavar="N",
              help="Keep the newest N generations of each repository.")
@click.option("--older-than", "older_than", callback=duration_option, metavar="DURATION",
              help="Remove generations older than this (10m, 12h, 7d); the newest N of "
              "--keep (default 1) stay.")
@click.option("--registry", "in_registry", is_flag=True,
              help="Also delete them from REPOSITORY's registry (it must allow deletes).")
@click.option("--dry-run", is_flag=True, help="Say what would go; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@registry_options
@click.pass_obj
def prune_command(g: Globals, repository: str | None, keep: int | None,
                  older_than: float | None, in_registry: bool, dry_run: bool, as_json: bool,
                  username: str | None, password_stdin: bool, ca_file: str | None,
                  insecure: bool) -> None:
    """Remove old checkpoint generations from the local store (all repositories, or
    REPOSITORY's), keeping the newest --keep N and those newer than --older-than. Tags on the
    same image are one generation; a pack stays while any kept generation uses it."""
    if in_registry and not repository:
        raise click.UsageError("--registry needs REPOSITORY")
    if not in_registry and (unused := given("username", "password_stdin", "ca_file", "insecure")):
        raise click.UsageError(f"{', '.join(unused)} reach a registry: without --registry, "
                               "prune touches only the local store (give --registry REPOSITORY)")
    result = prune(config.load(), Retention(keep, older_than), repository,
                   registry=in_registry, dry_run=dry_run,
                   access=access_from(username, password_stdin, ca_file, insecure),
                   progress=g.progress(quiet=as_json))
    if as_json:
        emit_json(result.to_json())
    else:
        verb = "would remove" if dry_run else "removed"
        for ref in result.removed:
            click.echo(f"{verb} {ref}")
        for ref in result.registry_removed:
            click.echo(f"{verb} {ref} from the registry")
        # generations as --keep counts them (docs/generations.md), with their tags
        click.echo(f"kept {result.kept_generations} local generation(s) "
                   f"({len(result.kept)} tag(s))"
                   + (f", {result.registry_kept_generations} generation(s) in the registry "
                      f"({len(result.registry_kept)} tag(s))" if in_registry else ""))
    if result.registry_error:
        click.echo(f"torpor: error: {result.registry_error}", err=True)
        click.get_current_context().exit(1)


COMMANDS = {"prune": prune_command}
