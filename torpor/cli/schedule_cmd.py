"""torpor schedule add|ls|rm: periodic checkpoints that torpord runs (ops/schedule_book.py)."""

from __future__ import annotations

import os
import time

import click

from torpor import config, handoff
from torpor.cli.durations import duration_option
from torpor.cli.output import Globals, emit_json, table
from torpor.errors import NotFound, TorporError
from torpor.ops.schedule import Schedule
from torpor.ops.schedule_book import Book, Entry


@click.group("schedule")
def schedule_group() -> None:
    """Periodic checkpoints of many containers, run by the node service torpord."""


def _book() -> Book:
    return Book(config.load().image_store)


@schedule_group.command("add")
@click.argument("container")
@click.option("-t", "--tag", "ref", required=True, metavar="REF",
              help="The series' reference: each generation is REF's tag + time, REF's tag "
              "(or latest) moves along, as with checkpoint --every.")
@click.option("--every", required=True, callback=duration_option, metavar="DURATION",
              help="How often (10m, 1h).")
@click.option("--keep", type=click.IntRange(min=0), metavar="N",
              help="Keep the newest N generations (locally, and with --push in the registry).")
@click.option("--older-than", "older_than", callback=duration_option, metavar="DURATION",
              help="Remove generations older than DURATION.")
@click.option("--push", is_flag=True, help="Push each generation to REF's registry.")
@click.pass_obj
def add_command(g: Globals, container: str, ref: str, every: float, keep: int | None,
                older_than: float | None, push: bool) -> None:
    """Checkpoint CONTAINER every DURATION, leaving it running (torpord runs the rounds: it
    must be running; a schedule survives restarts of it and of the node)."""
    cfg = config.load()
    answer = handoff.connect(cfg.service_socket) if cfg.service_socket else None
    if answer is not None:
        answer.close()
    else:
        raise TorporError(f"torpord does not answer on {cfg.service_socket or '(no socket)'}: "
                          "schedules are run by it",
                          hint="start it: systemctl enable --now torpord (packaging/systemd), "
                          "or run checkpoint --every in the foreground")
    Schedule(every)   # the same bounds as --every
    with g.client() as client:
        try:
            client.get_container(container)
        except NotFound:
            raise NotFound(f"container {container} does not exist in namespace "
                           f"{g.namespace}") from None
    Book(cfg.image_store).add(Entry(g.namespace, container, ref, every, keep, older_than, push))
    click.echo(f"scheduled {container}: {ref} every {every:g}s"
               + (f", keeping {keep}" if keep is not None else "")
               + (", pushed" if push else ""))


@schedule_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the schedules as JSON.")
def ls_command(as_json: bool) -> None:
    """The schedules, their last round and when the next is due."""
    entries = _book().read()
    if as_json:
        emit_json([{**e.__dict__, "next_due": e.next_due()} for e in entries])
        return
    now = time.time()

    def ago(t: float) -> str:
        return "-" if not t else f"{now - t:.0f}s ago"

    click.echo(table(["NAMESPACE", "CONTAINER", "REF", "EVERY", "ROUNDS", "LAST", "RESULT",
                      "NEXT"],
                     [[e.namespace, e.container, e.ref, f"{e.every_s:g}s", str(e.rounds),
                       ago(e.last_started),
                       "-" if e.last_status is None else "ok" if e.last_status == 0 else
                       f"failed (exit {e.last_status}, {e.failures} in a row)",
                       f"in {max(0.0, e.next_due() - now):.0f}s"] for e in entries]))


@schedule_group.command("rm")
@click.argument("container")
@click.pass_obj
def rm_command(g: Globals, container: str) -> None:
    """Stop checkpointing CONTAINER (a round under way completes; its images stay)."""
    if not _book().remove(g.namespace, container):
        raise NotFound(f"no schedule for {container} in namespace {g.namespace}")
    click.echo(f"unscheduled {container}")


def log_path(log_dir: str, entry: Entry) -> str:
    """Where torpord writes the output of a schedule's rounds."""
    return os.path.join(log_dir, f"schedule-{entry.namespace}-{entry.container}.log")


COMMANDS = {"schedule": schedule_group}
