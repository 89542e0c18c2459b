"""The periodic checkpoints torpord runs (`torpor schedule add|ls|rm`), kept on disk.

One file, `<[image] store>/schedules.json` (the store is on disk; `[runtime] state_dir` is a
tmpfs that a reboot empties), written atomically and durably under a lock
(`schedules.lock`, flock) by both the CLI, which adds and removes schedules, and torpord,
which records each round's outcome. A schedule is one container of one containerd
namespace: REF, the interval and the retention of `torpor checkpoint -t REF --every D`. Its
rounds run as that command does one round (ops/schedule.py: the generation, the moving tag,
retention); each round's start, length and exit status are kept, so that after a restart of
the service a schedule picks up where it was: a round that is due runs at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields

from torpor.atomicfile import write_atomic
from torpor.errors import ConfigError
from torpor.formats import names

FILE = "schedules.json"
LOCK = "schedules.lock"
VERSION = 1


@dataclass
class Entry:
    namespace: str
    container: str
    ref: str
    every_s: float
    keep: int | None = None
    older_than_s: float | None = None
    push: bool = False
    added: float = field(default_factory=time.time)
    last_started: float = 0.0      # time.time() of the last round's start (0: none yet)
    last_seconds: float = 0.0
    last_status: int | None = None  # the round's exit status (0: a new generation)
    failures: int = 0               # failed rounds in a row
    rounds: int = 0                 # rounds that made a generation

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.container

    def next_due(self) -> float:
        return self.last_started + self.every_s if self.last_started else self.added

    def argv(self) -> list[str]:
        """One round, as `torpor checkpoint ... --every D --rounds 1` runs it."""
        argv = ["torpor", "--namespace", self.namespace, "checkpoint", self.container,
                "-t", self.ref, "--every", f"{self.every_s:g}s", "--rounds", "1"]
        if self.keep is not None:
            argv += ["--keep", str(self.keep)]
        if self.older_than_s is not None:
            argv += ["--older-than", f"{self.older_than_s:g}s"]
        return argv + (["--push"] if self.push else [])


class Book:
    def __init__(self, store_root: str) -> None:
        self.root = store_root
        self.path = os.path.join(store_root, FILE)

    def read(self) -> list[Entry]:
        try:
            with open(self.path, "rb") as f:
                doc = json.loads(f.read())
        except FileNotFoundError:
            return []
        except ValueError as e:
            raise ConfigError(f"{self.path} is not valid JSON: {e}") from None
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            raise ConfigError(f"{self.path}: version {doc.get('version')!r} is not known to "
                              "this torpor" if isinstance(doc, dict) else
                              f"{self.path} is not a schedule book")
        known = {f.name for f in fields(Entry)}
        return [Entry(**{k: v for k, v in e.items() if k in known}) for e in doc["schedules"]]

    def mtime(self) -> float:
        try:
            return os.stat(self.path).st_mtime
        except FileNotFoundError:
            return 0.0

    @contextlib.contextmanager
    def edit(self) -> Iterator[list[Entry]]:
        """The entries, under the lock; written back when the block ends without an error."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.root, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries = self.read()
            yield entries
            data = json.dumps({"version": VERSION, "schedules": [asdict(e) for e in entries]},
                              indent=1, sort_keys=True).encode() + b"\n"
            write_atomic(self.path, data, mode=0o600)
        finally:
            os.close(fd)

    def add(self, entry: Entry) -> None:
        names.check_identifier(entry.container, "the container name")
        names.check_identifier(entry.namespace, "the containerd namespace")
        with self.edit() as entries:
            entries[:] = [e for e in entries if e.key != entry.key] + [entry]

    def remove(self, namespace: str, container: str) -> bool:
        with self.edit() as entries:
            kept = [e for e in entries if e.key != (namespace, container)]
            gone = len(kept) != len(entries)
            entries[:] = kept
        return gone

    def record(self, key: tuple[str, str], started: float, seconds: float, status: int) -> None:
        """A round's outcome, on the schedule it ran for (none when it was removed meanwhile)."""
        with self.edit() as entries:
            for entry in entries:
                if entry.key == key:
                    entry.last_started, entry.last_seconds = started, seconds
                    entry.last_status = status
                    entry.failures = 0 if status == 0 else entry.failures + 1
                    entry.rounds += status == 0
