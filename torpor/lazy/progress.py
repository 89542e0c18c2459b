"""How far each lazy restore on this node is: one small JSON file per restore under
`[runtime] state_dir`/lazy-restores, rewritten about once a second while the workload's memory
arrives and removed when the restore ends, whichever way. `torpor ls` and torpord's metrics read
them, and `torpor inspect` of the image; a file whose restore is no longer alive (torpor
killed) is dropped when read."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass

from torpor.atomicfile import write_atomic
from torpor.capture.processes import start_time

DIR = "lazy-restores"
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")


@dataclass(frozen=True)
class LazyProgress:
    namespace: str
    container: str
    source: str            # what is restored: the reference or path the user gave
    lazy_bytes: int        # the memory that arrives after the workload runs
    placed_bytes: int      # of it, placed so far
    remote_bytes: int      # fetched from the registry so far
    local_bytes: int       # read from this node's packs so far
    started: float         # wall clock, when the workload began to run
    pid: int               # the restoring process: a record whose pid is gone is stale
    pid_start: int = 0     # its start time (/proc/PID/stat), so that a reused pid is no match
    digest: str = ""       # the image index's digest: `torpor inspect` finds its restores by it

    @property
    def fraction(self) -> float:
        return self.placed_bytes / self.lazy_bytes if self.lazy_bytes else 1.0


def _file(state_dir: str, namespace: str, container: str) -> str:
    """One file per namespace and container ('@' is in neither's alphabet); a name that is not
    plain becomes its digest, so no name ever steps out of the directory."""
    key = f"{namespace}@{container}"
    if not (_PLAIN.match(namespace) and _PLAIN.match(container)):
        key = hashlib.sha256(f"{namespace}\0{container}".encode()).hexdigest()
    return os.path.join(state_dir, DIR, f"{key}.json")


def write(state_dir: str, progress: LazyProgress) -> None:
    path = _file(state_dir, progress.namespace, progress.container)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_atomic(path, json.dumps(asdict(progress)).encode(), mode=0o600, durable=False)


def remove(state_dir: str, namespace: str, container: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_file(state_dir, namespace, container))


def current(state_dir: str) -> list[LazyProgress]:
    """The lazy restores under way on this node, oldest first; stale records are removed
    (their process is gone, or its pid belongs to another process now)."""
    found = []
    directory = os.path.join(state_dir, DIR)
    try:
        names = sorted(n for n in os.listdir(directory)
                       if n.endswith(".json") and not n.startswith("."))   # not a temp file
    except OSError:   # none yet, or another user's state dir: nothing to show
        return []
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                progress = LazyProgress(**json.load(f))
        except (OSError, ValueError, TypeError):
            continue   # being replaced, or not ours
        started = start_time(progress.pid)
        if started and started == (progress.pid_start or started):
            found.append(progress)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return sorted(found, key=lambda p: p.started)


def of_image(state_dir: str, source: str, digest: str | None) -> list[LazyProgress]:
    """The lazy restores under way here of one image: restored from `source` as written, or
    from the image whose index digest is `digest` (under any name)."""
    return [p for p in current(state_dir)
            if p.source == source or (digest and p.digest == digest)]


def since(progress: LazyProgress, now: float | None = None) -> float:
    return max(0.0, (now if now is not None else time.time()) - progress.started)
