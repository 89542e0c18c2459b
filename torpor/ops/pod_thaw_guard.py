"""The backstop of a pod frozen for a migration (ops/pod_freeze): a small process that resumes
the pod's containers should their holder die without doing it.

`torpor kube freeze` runs inside the node agent's pod. A restart of that pod (a DaemonSet
update) SIGKILLs every process in its cgroup, the holder included: no `finally` runs, and the
pod would stay paused. So, before pausing anything, the holder starts this guard detached (a
session of its own), and the guard first leaves the agent's cgroups for each hierarchy's root,
where that kill does not reach. Then, every 0.2 s, it looks at the holder:
- the holder is gone (its pid no longer names the process it was): each container it was given
  that containerd still reports PAUSED is resumed, and the guard ends;
- the deadline passed (the hold's own --for, plus a margin): the same;
- the holder said it is done (`done` on the guard's stdin, once it resumed everything itself):
  the guard ends at once, touching nothing. Its stdin closing without that word is the
  holder's death.
The guard prints `ready` once it is out of the agent's cgroups; the holder pauses nothing
before.

    python -m torpor.ops.pod_thaw_guard HOLDER_PID HOLDER_START DEADLINE ADDRESS NAMESPACE ID...
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time

from torpor.capture.processes import start_time
from torpor.containerd.api.task_pb2 import PAUSED
from torpor.containerd.client import Client
from torpor.errors import ContainerdError

CGROUP_ROOT = "/sys/fs/cgroup"
MARGIN_S = 5


def leave_cgroups() -> None:
    """Into the root cgroup of every hierarchy this process is in (v1 and v2)."""
    with open("/proc/self/cgroup") as f:
        lines = f.read().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if path == "/":
            continue
        if controllers == "":
            where = CGROUP_ROOT if os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")) \
                else os.path.join(CGROUP_ROOT, "unified")
        else:
            name = controllers.removeprefix("name=")
            where = os.path.join(CGROUP_ROOT, name)
            if not os.path.isdir(where):
                where = os.path.join(CGROUP_ROOT, controllers.split(",")[0])
        with contextlib.suppress(OSError), open(os.path.join(where, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


def resume_paused(address: str, namespace: str, ids: list[str]) -> None:
    with Client(address, namespace) as client:
        for container_id in ids:
            with contextlib.suppress(ContainerdError):
                if client.get_task(container_id).process.status == PAUSED:
                    client.resume_task(container_id)


def main(argv: list[str]) -> int:
    holder, started, deadline, address, namespace, *ids = argv[1:]
    leave_cgroups()
    print("ready", flush=True)
    until = float(deadline) + MARGIN_S
    while time.time() < until:
        readable, _, _ = select.select([sys.stdin], [], [], 0.2)
        if readable:
            if os.read(sys.stdin.fileno(), 64).startswith(b"done"):
                return 0      # the holder resumed everything itself
            break             # its end of the pipe closed without a word: it died
        if start_time(int(holder)) != int(started):
            break             # the holder died without letting go
    resume_paused(address, namespace, ids)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
