"""The guard of a lazy restore: kills the workload if torpor's page source dies first.

`criu lazy-pages` exits when the page server's socket closes, and the kernel then backs every
page not placed yet with zeros: the workload would run on with wrong memory. So torpor starts
this small process beside the page server, in its own session, holding a second copy of the
server's end of the socket (the daemon sees no close while the guard lives) and the read end of
a pipe from the restore: "cgroup DIR" (where the container's processes will be), "pid N" (its
init, once restored), "done" (every page placed). At the end of the pipe without "done" (the
restore process was killed), it freezes the container's cgroup, kills every process in it,
thaws it, and only then exits, closing the socket. Stdlib and freezer.py only.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from torpor.capture.freezer import Cgroup

WAIT_FOR_CGROUP_S = 120.0   # a restore cut off before its task started: runc may still be at it


def kill_cgroup(cgroup: Cgroup) -> None:
    """Freeze, SIGKILL every process, thaw: none of them runs one more instruction."""
    try:
        cgroup.freeze(timeout=5.0)
    except Exception:
        pass
    for pid in cgroup.pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        cgroup.thaw()
    except OSError:
        pass


def main(argv: list[str]) -> int:
    pipe = int(argv[1])   # argv[2]: the socket's number, held only to keep it open
    candidates: list[Cgroup] = []
    pid_cgroup: Cgroup | None = None
    with os.fdopen(pipe, "r") as lines:
        for line in lines:
            word, _, value = line.strip().partition(" ")
            if word == "done":
                return 0
            if word == "cgroup":
                candidates.append(Cgroup(value, 1 if "/freezer/" in value else 2))
            elif word == "pid":
                try:
                    pid_cgroup = Cgroup.of_pid(int(value))
                except Exception:
                    pid_cgroup = None
    if pid_cgroup is not None:
        kill_cgroup(pid_cgroup)
        return 1
    deadline = time.monotonic() + WAIT_FOR_CGROUP_S
    while time.monotonic() < deadline:
        for cgroup in candidates:
            if os.path.isdir(cgroup.path) and cgroup.pids():
                kill_cgroup(cgroup)
                return 1
        time.sleep(0.2)
    return 1


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(main(sys.argv))
