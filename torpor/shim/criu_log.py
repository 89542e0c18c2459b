"""CRIU's own reason for a failure, read from the log runc asked it to write."""

from __future__ import annotations

import os
import re

# "(00.455232)      6: Error (soccr/soccr.c:499): ...": the pid is there for a restored task's
# own lines (and absent for CRIU's)
_ERROR = re.compile(r"^\(\s*[\d.]+\)\s+(?:\d+:\s+)?Error\s+\(([^)]*)\):\s*(.*)$")
# Logged on every run on some kernels, and harmless (CRIU goes on): never the reason.
_NOISE = ("Can't setup RLIMIT_NOFILE for self",
          # consequences, not causes: CRIU logs these after the error that matters
          "Restoring FAILED", "Dumping FAILED", "cgroupd: recv req error")


def reasons(log_path: str, limit: int = 3) -> list[str]:
    """The first `limit` distinct `Error (...)` lines of a CRIU log: the cause comes first."""
    try:
        with open(log_path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        match = _ERROR.match(line.strip())
        if match:
            text = match.group(2).strip()
            if text and text not in found and not any(n in text for n in _NOISE):
                found.append(text)
    return found[:limit]


def summary(work_path: str | None, log_name: str) -> tuple[str, str | None]:
    """('reason; reason', log path) for dump.log or restore.log in the work directory."""
    if not work_path:
        return "", None
    path = os.path.join(work_path, log_name)
    return "; ".join(reasons(path)), (path if os.path.exists(path) else None)


def last_lines(path: str | None, limit: int = 4) -> list[str]:
    """The last `limit` lines of a CRIU log, where a CRIU that hung stopped."""
    if not path:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - 16384, 0))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    return [" ".join(line.split()) for line in lines if line.strip()][-limit:]
