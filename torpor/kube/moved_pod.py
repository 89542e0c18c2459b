"""Which pods `torpor kube migrate` moves, and the pod it makes on the target node: the
original's spec with each container's image replaced by its checkpoint image and the target
node named. Pure functions of the pod's JSON.

Refused, in words, before anything is made:
- a pod that is not running, or whose containers are not all running (a checkpoint of a
  waiting container has nothing to restore);
- a pod a controller owns (ReplicaSet, StatefulSet, Job, DaemonSet...): the controller would
  adopt the moved pod and scale one of the two away, or replace the original once it goes;
- native sidecars (init containers with restartPolicy Always): not moved yet;
- volumes other than emptyDir (saved with the checkpoint) and those kubelet makes from the API
  (configMap, secret, projected, downwardAPI): a persistentVolumeClaim, hostPath, CSI or NFS
  volume would be shared by the two pods, or not attach on the target.

The new pod keeps labels (a Service finds it), annotations (but kubectl's last-applied copy
and io.torpor.restore.cold-start),
volumes, the runtime class and every container setting but the image. Init containers that ran
to completion are left out: their work is in the checkpoint (the emptyDir volumes come back),
and running them again could undo it. Its hostname is the original's name, as the restored
processes knew it, where that name is a valid hostname.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from torpor.errors import KubeError

MIGRATED_FROM = "torpor.io/migrated-from"           # NAMESPACE/POD@NODE
# kubectl's copy of what was applied; a cold start asked for (the moved pod must restore)
DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",
                       "io.torpor.restore.cold-start")
# saved with the checkpoint (emptyDir), or made again by kubelet on the target from the API
MOVABLE_VOLUMES = ("emptyDir", "configMap", "secret", "projected", "downwardAPI")
_HOSTNAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def containers_to_move(pod: dict[str, Any], target: str) -> list[str]:
    """The names of the pod's containers, in order, once the pod is found movable to
    `target`."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    name = f"{meta.get('namespace', 'default')}/{meta['name']}"
    node = spec.get("nodeName")
    if not node:
        raise KubeError(f"pod {name} is not on a node yet")
    if node == target:
        raise KubeError(f"pod {name} already runs on {target}")
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    if owners:
        owner = owners[0]
        raise KubeError(
            f"pod {name} is managed by {owner.get('kind')} {owner.get('name')}: its controller "
            "would adopt the moved pod and remove one of the two, or replace the original once "
            "it goes; torpor kube migrate moves pods no controller owns")
    sidecars = [c["name"] for c in spec.get("initContainers") or []
                if c.get("restartPolicy") == "Always"]
    if sidecars:
        raise KubeError(f"pod {name} has native sidecar containers ({', '.join(sidecars)}): "
                        "they are not moved yet")
    shared = [f"{v['name']} ({kind})" for v in spec.get("volumes") or []
              for kind in v if kind != "name" and kind not in MOVABLE_VOLUMES]
    if shared:
        raise KubeError(f"pod {name} has volumes that do not move with it: {', '.join(shared)}; "
                        "the moved pod and the original would share them, or the target could "
                        "not attach them: torpor kube migrate moves pods whose volumes are "
                        f"{', '.join(MOVABLE_VOLUMES)}")
    if status.get("phase") != "Running":
        raise KubeError(f"pod {name} is {status.get('phase') or 'in no phase'}, not Running")
    names = [c["name"] for c in spec["containers"]]
    running = {s["name"] for s in status.get("containerStatuses") or []
               if "running" in (s.get("state") or {})}
    waiting = [n for n in names if n not in running]
    if waiting:
        raise KubeError(f"pod {name}: container(s) {', '.join(waiting)} not running: a "
                        "checkpoint has nothing of them to restore")
    return names


def liveness_budget(pod: dict[str, Any]) -> int | None:
    """The fewest seconds a container of the pod may fail its liveness probe before kubelet
    restarts it (periodSeconds x failureThreshold, Kubernetes' defaults 10 and 3); None where
    no container has one. A pod frozen longer than this loses a container, frozen or not."""
    budgets = []
    for container in pod["spec"]["containers"]:
        probe = container.get("livenessProbe")
        if probe:
            budgets.append(int(probe.get("periodSeconds") or 10) *
                           int(probe.get("failureThreshold") or 3))
    return min(budgets) if budgets else None


def moved_pod(pod: dict[str, Any], images: dict[str, str], target: str,
              new_name: str | None = None) -> dict[str, Any]:
    """The pod for `target`: `images` maps each container's name to its checkpoint image."""
    meta, spec = pod["metadata"], pod["spec"]
    namespace = meta.get("namespace", "default")
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k not in DROPPED_ANNOTATIONS}
    annotations[MIGRATED_FROM] = f"{namespace}/{meta['name']}@{spec['nodeName']}"
    new_meta: dict[str, Any] = {"namespace": namespace, "annotations": annotations}
    if meta.get("labels"):
        new_meta["labels"] = dict(meta["labels"])
    if new_name:
        new_meta["name"] = new_name
    else:
        new_meta["generateName"] = meta["name"][:57] + "-"
    new_spec = copy.deepcopy(spec)
    new_spec["nodeName"] = target
    new_spec.pop("initContainers", None)
    new_spec.pop("ephemeralContainers", None)
    for container in new_spec["containers"]:
        container["image"] = images[container["name"]]
        container["imagePullPolicy"] = "IfNotPresent"
    if "hostname" not in new_spec and _HOSTNAME.fullmatch(meta["name"]):
        new_spec["hostname"] = meta["name"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": new_meta, "spec": new_spec}


def failure_of(pod: dict[str, Any]) -> str | None:
    """Why a pod will not run, as kubelet says it (a container waiting on an error, one that
    ended or restarted), or None while it may still come up."""
    for s in (pod.get("status") or {}).get("containerStatuses") or []:
        if s.get("restartCount"):
            return f"container {s['name']} restarted ({s['restartCount']} times)"
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return f"the pod is {status['phase']}: {status.get('reason', '')} {status.get('message', '')}".strip()
    for s in status.get("containerStatuses") or []:
        state = s.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in ("CreateContainerError", "CreateContainerConfigError",
                                     "ErrImagePull", "ImagePullBackOff", "CrashLoopBackOff",
                                     "InvalidImageName", "RunContainerError"):
            return f"container {s['name']}: {waiting['reason']}: {waiting.get('message', '')}"
        ended = state.get("terminated") or s.get("lastState", {}).get("terminated")
        if ended:
            return (f"container {s['name']} ended ({ended.get('reason', '')}, exit "
                    f"{ended.get('exitCode')}): {ended.get('message', '')}".rstrip(": "))
    return None


def is_running(pod: dict[str, Any]) -> bool:
    """Every container running and ready."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    names = {c["name"] for c in pod["spec"]["containers"]}
    up = {s["name"] for s in statuses if "running" in (s.get("state") or {}) and s.get("ready")}
    return bool(names) and names <= up
