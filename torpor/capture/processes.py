"""The container's process tree, as `torpor inspect` shows it."""

from __future__ import annotations

from collections.abc import Iterable

from torpor.formats.state import ProcessInfo


def process_tree(pids: Iterable[int]) -> tuple[ProcessInfo, ...]:
    """pid, parent, name, command line and resident memory of each process still there."""
    tree = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
        except OSError:
            continue
        tree.append(ProcessInfo(
            pid=pid, ns_pid=int(status.get("NSpid", str(pid)).split()[-1]),
            ppid=int(status.get("PPid", "0").strip()), name=status.get("Name", "").strip(),
            cmdline=cmdline, rss_bytes=int(status.get("VmRSS", "0 kB").split()[0]) * 1024))
    return tuple(tree)


def ns_pid(pid: int) -> int:
    """pid as the container sees it (the last NSpid), which CRIU keeps across a restore."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except OSError:
        pass
    return pid


def start_time(pid: int) -> int:
    """The process's start time in clock ticks after boot (0: no such process): with the pid,
    what names one process (a pid reused is another)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0
