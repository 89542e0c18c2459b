"""A pod's containers frozen together for as long as someone holds them: `torpor kube freeze
POD_UID`, which `torpor kube migrate` runs on the pod's node (through the node agent) so that
kubelet checkpoints every container of a pod at one instant.

1. the pod's containers are found in containerd's CRI namespace (k8s.io) by their labels
   (io.kubernetes.pod.uid; the sandbox is left alone: it holds no state);
2. each running one is paused through containerd (runc pause: the cgroup freezer), all of them
   before the caller is told; a checkpoint of a paused container leaves it paused (CRIU keeps a
   frozen cgroup frozen), so every checkpoint taken meanwhile is of the same instant;
3. every container paused here is resumed when the hold ends, whatever ends it: the caller lets
   go, the caller goes away (its stdin closes), a signal, or the deadline; each resume is tried
   again for about 10 s (containerd restarting). A container that fails to pause resumes the
   ones already paused before the error is raised.

A pod is never left frozen by a holder that went away, even SIGKILLed (the agent pod's restart
kills every process in it): before pausing anything the holder starts a guard outside the
agent's cgroups (ops/pod_thaw_guard), which resumes what is still paused once the holder is gone
or the hold's deadline passed. A container that was paused before (`ctr task pause`) is neither
counted nor resumed.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from torpor.containerd.api.task_pb2 import RUNNING
from torpor.containerd.client import Client
from torpor.errors import ContainerdError, KubeError

CRI_NAMESPACE = "k8s.io"
RESUME_TRIES = 6           # about 10 s of containerd not answering
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"
KIND = "io.cri-containerd.kind"


@dataclass(frozen=True)
class FrozenContainer:
    id: str
    name: str          # the container's name in the pod


def pod_containers(client: Client, pod_uid: str) -> list[FrozenContainer]:
    """The pod's running containers (not its sandbox), by name."""
    found = client.list_containers(f'labels."{POD_UID}"=={pod_uid}')
    running = []
    for c in found:
        if c.labels.get(KIND) != "container":
            continue
        with contextlib.suppress(ContainerdError):     # no task: created, or gone
            if client.get_task(c.id).process.status == RUNNING:
                running.append(FrozenContainer(c.id, c.labels.get(CONTAINER_NAME, c.id)))
    return sorted(running, key=lambda c: c.name)


@contextlib.contextmanager
def frozen(client: Client, pod_uid: str, hold_s: float) -> Iterator[list[FrozenContainer]]:
    """The pod's running containers paused for the block (at most `hold_s`, then the guard
    resumes them whatever happened to this process)."""
    containers = pod_containers(client, pod_uid)
    if not containers:
        raise KubeError(f"no running container of pod {pod_uid} on this node")
    guard = _start_guard(client.address, time.time() + hold_s, [c.id for c in containers])
    paused: list[FrozenContainer] = []
    try:
        for c in containers:
            client.pause_task(c.id)
            paused.append(c)
        yield paused
    finally:
        failed = []
        for c in paused:
            for attempt in range(RESUME_TRIES):     # containerd restarting: it comes back
                try:
                    client.resume_task(c.id)
                    break
                except ContainerdError as e:
                    if attempt == RESUME_TRIES - 1:
                        failed.append(f"{c.name}: {e}")
                    time.sleep(0.5 * (attempt + 1))
        if not failed:
            _dismiss(guard)
        if failed:    # the guard tries again once this process is gone
            raise KubeError("could not resume every container of the pod (`ctr -n k8s.io task "
                            "resume ID` does it by hand): " + "; ".join(failed))


def _start_guard(address: str, deadline: float, ids: list[str]) -> subprocess.Popen[bytes]:
    """torpor.ops.pod_thaw_guard for this hold, out of this pod's cgroups before anything is
    paused."""
    import torpor
    from torpor.capture.processes import start_time

    top = os.path.dirname(os.path.dirname(os.path.abspath(torpor.__file__)))
    env = {**os.environ, "PYTHONPATH": top + os.pathsep + os.environ.get("PYTHONPATH", "")}
    guard = subprocess.Popen(
        [sys.executable, "-m", "torpor.ops.pod_thaw_guard", str(os.getpid()),
         str(start_time(os.getpid())), repr(deadline), address, CRI_NAMESPACE, *ids],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True, env=env, close_fds=True)
    assert guard.stdout is not None
    ready, _, _ = select.select([guard.stdout], [], [], 30)
    if not ready or guard.stdout.readline().strip() != b"ready":
        guard.kill()
        raise KubeError("the pod's thaw guard did not start: nothing was paused")
    return guard


def _dismiss(guard: subprocess.Popen[bytes]) -> None:
    """Everything is resumed: the guard may go, touching nothing."""
    assert guard.stdin is not None
    with contextlib.suppress(OSError):
        guard.stdin.write(b"done\n")
        guard.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        guard.wait(timeout=5)
