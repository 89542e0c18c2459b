"""`torpor checkpoint ... --every D [--keep N] [--older-than D]`: the periodic mode's output,
one line per generation (ops/schedule.py runs the series)."""

from __future__ import annotations

import json
import time

import click

from torpor import config
from torpor.cli.output import Globals, human_size
from torpor.errors import CheckpointError
from torpor.formats.request import CheckpointRequest
from torpor.ops.checkpoint import CheckpointTarget
from torpor.ops.prune import Retention
from torpor.ops.schedule import Round, Schedule, Stop, run


def periodic(g: Globals, container: str, request: CheckpointRequest, target: CheckpointTarget,
             every: float, keep: int | None, older_than: float | None, as_json: bool,
             rounds: int | None = None) -> None:
    retention = Retention(keep, older_than) if keep is not None or older_than is not None \
        else None
    schedule = Schedule(every, retention, rounds=rounds)
    errors: list[str] = []

    def report(outcome: Round) -> None:
        if outcome.error is not None:
            errors.append(outcome.error)
        if as_json:
            click.echo(json.dumps(outcome.to_json(), sort_keys=True, default=str))
            return
        when = time.strftime("%H:%M:%S", time.localtime(outcome.started))
        if outcome.error is not None:
            click.echo(f"{when} generation {outcome.number} ({outcome.ref}) failed: "
                       f"{outcome.error}", err=True)
            return
        result = outcome.result
        assert result is not None
        sent = f", {human_size(result.pushed.bytes_uploaded)} sent" if result.pushed else ""
        pruned = outcome.pruned
        gone = f"; removed {len(pruned.removed)} old" if pruned and pruned.removed else ""
        if pruned and pruned.registry_error:
            gone += f"; registry: {pruned.registry_error}"
        click.echo(f"{when} {outcome.ref}: {human_size(result.new_bytes)} new of "
                   f"{human_size(result.compressed_bytes)} stored{sent} in {outcome.seconds:.1f}s"
                   f"{gone}")

    with g.client() as client, Stop().on_signals() as stop:
        done = run(client, container, request, target, schedule, config.load(), stop, report,
                   g.progress(quiet=True))
    if not as_json:
        click.echo(f"stopped after {done} generation(s) of {container}")
    if rounds is not None and done < rounds:   # torpord's round: its status is the outcome
        raise CheckpointError(f"{rounds - done} of {rounds} round(s) of {container} made no "
                              f"generation" + (f": {errors[-1]}" if errors else ""))
