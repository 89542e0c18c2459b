"""`torpor checkpoint CONTAINER -t REF --every 10m [--keep 5] [--older-than 7d] [--push]`:
checkpoints again and again, in the foreground, until SIGTERM or SIGINT.

A series: REF's repository, REF's tag T (or none). Generation n is tagged `T-YYYYmmdd-HHMMSS`
(UTC; only the time when REF has no tag), and a moving tag T (`latest` when REF has none)
names the newest one. Each round, in order:
 1. checkpoint the container into the generation's tag (ops.checkpoint.checkpoint, always
    leaving it running), pushed with --push; each generation is built on the one before, so
    it stores and sends only what changed;
 2. move the moving tag to it: in the local store (a second entry linking the same blobs) and,
    with --push, in the registry (the same manifests under that tag);
 3. retention (--keep, --older-than, ops/prune.py), over the series' generations: this
    container's checkpoints in the repository tagged T-anything (its own T-STAMP tags and the
    user's T-1), or tagged STAMP when REF has none; never the moving tag, another tag or another
    container's: the local store, and the registry with --push (a registry that refuses deletes
    is reported once per round; nothing else is affected);
 4. wait for the next round: rounds start `every` apart; one that overran starts the next now.
SIGTERM or SIGINT between rounds ends the series at once; during a round, the round completes
first (the container is never left half-checkpointed), then it ends; a second signal aborts
the round. A failed round is reported and the next one is tried; `max_failures` in a row end
the series with the last error.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

from torpor.config import Config
from torpor.containerd.client import Client
from torpor.errors import CheckpointError, ConfigError, TorporError
from torpor.formats.request import CheckpointRequest
from torpor.image.generations import link_or_copy
from torpor.image.store import Store
from torpor.ops.checkpoint import CheckpointResult, CheckpointTarget, checkpoint
from torpor.ops.prune import PruneResult, Retention, prune
from torpor.ops.sources import registry_options
from torpor.registry import parse_reference, push_layout
from torpor.reporting import SILENT, Progress

STAMP = "%Y%m%d-%H%M%S"
STAMP_PATTERN = r"\d{8}-\d{6}"


@dataclass(frozen=True)
class Schedule:
    every_s: float
    retention: Retention | None = None
    max_failures: int = 3
    rounds: int | None = None          # stop after this many rounds tried (None: until a signal)

    def __post_init__(self) -> None:
        if self.every_s < 1:
            raise ConfigError("--every: give at least 1s between checkpoints")


@dataclass(frozen=True)
class Series:
    """The tags of one periodic series."""

    repository: str        # registry/repository
    tag: str | None        # REF's tag

    @classmethod
    def of(cls, ref: str) -> Series:
        parsed = parse_reference(ref)
        if parsed.digest:
            raise ConfigError(f"{ref}: a periodic series needs a tag or none, not a digest")
        return cls(f"{parsed.registry}/{parsed.repository}", parsed.tag)

    def generation(self, when: float) -> str:
        stamp = time.strftime(STAMP, time.gmtime(when))
        return f"{self.repository}:{self.tag}-{stamp}" if self.tag else \
            f"{self.repository}:{stamp}"

    @property
    def moving(self) -> str:
        return f"{self.repository}:{self.tag or 'latest'}"

    @property
    def pattern(self) -> re.Pattern[str]:
        """The tags of the series' generations: T-anything (its own T-STAMP ones and those the
        user made under its name, such as T-1), only STAMP when REF has no tag."""
        return re.compile(f"{re.escape(self.tag)}-.+" if self.tag else STAMP_PATTERN)


@dataclass(frozen=True)
class Round:
    number: int
    ref: str
    started: float                     # time.time()
    seconds: float
    result: CheckpointResult | None = None
    pruned: PruneResult | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "ref": self.ref, "started": self.started,
                "seconds": self.seconds, "error": self.error,
                "result": self.result.to_json() if self.result else None,
                "pruned": self.pruned.to_json() if self.pruned else None}


class Stop:
    """Set by SIGTERM or SIGINT: the series ends after the round in progress."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def wait(self, seconds: float) -> bool:
        return self.event.wait(max(0.0, seconds))

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    @contextlib.contextmanager
    def on_signals(self) -> Iterator[Stop]:
        def handler(signum: int, frame: FrameType | None) -> None:
            if self.event.is_set():
                raise KeyboardInterrupt  # the second signal: abort the round
            self.event.set()

        previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


def run(client: Client, container_id: str, request: CheckpointRequest, target: CheckpointTarget,
        schedule: Schedule, cfg: Config, stop: Stop, on_round: Callable[[Round], None],
        progress: Progress = SILENT) -> int:
    """Run the series until `stop` (or `schedule.rounds`); the number of rounds completed."""
    if target.ref is None:
        raise ConfigError("a periodic checkpoint needs -t REF")
    series = Series.of(target.ref)
    request = replace(request, criu=replace(request.criu, leave_running=True))
    failures = done = tried = 0
    next_start = time.monotonic()
    while not stop.requested and (schedule.rounds is None or tried < schedule.rounds):
        if stop.wait(next_start - time.monotonic()):
            break
        next_start += schedule.every_s
        if next_start < time.monotonic():
            next_start = time.monotonic()
        outcome = _round(client, container_id, request, target, series, schedule, cfg,
                         done + 1, progress)
        on_round(outcome)
        tried += 1
        if outcome.error is None:
            done += 1
            failures = 0
            continue
        failures += 1
        if failures >= schedule.max_failures:
            raise CheckpointError(f"{failures} checkpoints of {container_id} failed in a row; "
                                  f"the last: {outcome.error}")
    return done


def _round(client: Client, container_id: str, request: CheckpointRequest,
           target: CheckpointTarget, series: Series, schedule: Schedule, cfg: Config,
           number: int, progress: Progress) -> Round:
    started, t0 = time.time(), time.monotonic()
    ref = series.generation(started)
    try:
        # 1. the generation
        result = checkpoint(client, container_id, request, replace(target, ref=ref), cfg,
                            progress)
        # 2. the moving tag
        _move_tag(cfg, result, series, target)
        # 3. retention
        pruned = None
        if schedule.retention is not None:
            pruned = prune(cfg, schedule.retention, series.moving, tags=series.pattern,
                           container=container_id, registry=target.push,
                           access=target.registry, progress=progress)
    except TorporError as e:
        return Round(number, ref, started, time.monotonic() - t0, error=str(e))
    return Round(number, ref, started, time.monotonic() - t0, result, pruned)


def _move_tag(cfg: Config, result: CheckpointResult, series: Series,
              target: CheckpointTarget) -> None:
    if result.layout is None or result.ref is None:
        return
    store = Store(cfg.image_store)
    source = store.layout(result.ref).resolve()
    with store.staging(series.moving) as moving:  # the old entry stays until this one is whole
        for path in sorted(source.rglob("*")):
            there = moving / path.relative_to(source)
            if path.is_dir():
                there.mkdir(mode=0o700, exist_ok=True)
            else:
                link_or_copy(path, there)
    if target.push:
        push_layout(store.layout(series.moving), series.moving,
                    options=registry_options(cfg, series.moving, target.registry))
