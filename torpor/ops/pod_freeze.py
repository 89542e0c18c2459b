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

A pod is never left frozen by a holder that went away; a container that was paused before
(`ctr task pause`) is neither counted nor resumed. What this cannot survive is its own SIGKILL
(the agent pod's restart takes every process in it): then `ctr -n k8s.io task resume ID` on the
node, for each of the pod's containers, undoes it (docs/kubernetes.md).
"""

from __future__ import annotations

import contextlib
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
def frozen(client: Client, pod_uid: str) -> Iterator[list[FrozenContainer]]:
    containers = pod_containers(client, pod_uid)
    if not containers:
        raise KubeError(f"no running container of pod {pod_uid} on this node")
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
        if failed:
            raise KubeError("could not resume every container of the pod (`ctr -n k8s.io task "
                            "resume ID` does it by hand): " + "; ".join(failed))
