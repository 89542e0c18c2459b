"""Which pods `torpor kube migrate` moves, and the pod it makes on the target node."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from torpor.errors import KubeError
from torpor.kube.moved_pod import (
    MIGRATED_FROM,
    containers_to_move,
    failure_of,
    liveness_budget,
    moved_pod,
)


def running_pod(**meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"},
                     "annotations": {"team": "a",
                                     "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                     "uid": "u-1", "resourceVersion": "7", **meta},
        "spec": {"nodeName": "node-a", "runtimeClassName": "torpor",
                 "initContainers": [{"name": "setup", "image": "busybox"}],
                 "containers": [{"name": "app", "image": "app:1", "command": ["serve"]},
                                {"name": "side", "image": "side:1"}],
                 "volumes": [{"name": "data", "emptyDir": {}}]},
        "status": {"phase": "Running",
                   "containerStatuses": [{"name": "app", "state": {"running": {}}},
                                         {"name": "side", "state": {"running": {}}}]},
    }


def test_a_running_pod_moves_every_container_in_order() -> None:
    assert containers_to_move(running_pod(), "node-b") == ["app", "side"]


@pytest.mark.parametrize("change, said", [
    (lambda p: p["spec"].update(nodeName="node-b"), "already runs on node-b"),
    (lambda p: p["spec"].pop("nodeName"), "not on a node"),
    (lambda p: p["metadata"].update(ownerReferences=[
        {"kind": "ReplicaSet", "name": "web-5d", "controller": True}]),
     "managed by ReplicaSet web-5d"),
    (lambda p: p["spec"]["initContainers"].append(
        {"name": "proxy", "image": "p", "restartPolicy": "Always"}), "native sidecar"),
    (lambda p: p["status"].update(phase="Pending"), "Pending, not Running"),
    (lambda p: p["spec"]["volumes"].append({"name": "db", "persistentVolumeClaim": {
        "claimName": "db"}}), "volumes that do not move with it: db .persistentVolumeClaim."),
    (lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/srv"}}),
     "h .hostPath."),
    (lambda p: p["status"]["containerStatuses"][1].update(state={"waiting": {}}),
     "side not running"),
])
def test_what_is_refused_before_anything_is_made(change: Any, said: str) -> None:
    pod = running_pod()
    change(pod)
    with pytest.raises(KubeError, match=said):
        containers_to_move(pod, "node-b")


def test_an_owner_that_is_not_a_controller_does_not_stop_a_move() -> None:
    pod = running_pod(ownerReferences=[{"kind": "ConfigMap", "name": "x"}])
    assert containers_to_move(pod, "node-b") == ["app", "side"]


def test_the_moved_pod_is_the_original_on_the_target_from_its_checkpoint_images() -> None:
    original = running_pod()
    kept = copy.deepcopy(original)
    moved = moved_pod(original, {"app": "reg/shop/web/app:T", "side": "reg/shop/web/side:T"},
                      "node-b")
    assert original == kept                                   # the original is not touched
    assert moved["metadata"] == {
        "namespace": "shop", "generateName": "web-", "labels": {"app": "web"},
        "annotations": {"team": "a", MIGRATED_FROM: "shop/web@node-a"}}
    spec = moved["spec"]
    assert spec["nodeName"] == "node-b" and spec["runtimeClassName"] == "torpor"
    assert [(c["name"], c["image"], c["imagePullPolicy"]) for c in spec["containers"]] == [
        ("app", "reg/shop/web/app:T", "IfNotPresent"), ("side", "reg/shop/web/side:T",
                                                        "IfNotPresent")]
    assert spec["containers"][0]["command"] == ["serve"]
    assert "initContainers" not in spec                        # they ran; their work is saved
    assert spec["volumes"] == original["spec"]["volumes"]
    assert spec["hostname"] == "web"                           # as the processes knew it
    assert "status" not in moved


def test_a_name_given_is_the_name_and_a_dotted_name_is_no_hostname() -> None:
    moved = moved_pod(running_pod(name="web.v2"), {"app": "a", "side": "s"}, "node-b", "web-b")
    assert moved["metadata"]["name"] == "web-b" and "generateName" not in moved["metadata"]
    assert "hostname" not in moved["spec"]


@pytest.mark.parametrize("status, said", [
    ({"phase": "Pending", "containerStatuses": [{"name": "app", "state": {"waiting": {
        "reason": "CreateContainerError", "message": "criu failed: type RESTORE"}}}]},
     "container app: CreateContainerError: criu failed: type RESTORE"),
    ({"phase": "Running", "containerStatuses": [{"name": "app", "state": {"running": {}},
                                                 "lastState": {"terminated": {
                                                     "reason": "Error", "exitCode": 1}}}]},
     "container app ended (Error, exit 1)"),
    ({"phase": "Failed", "reason": "Evicted"}, "the pod is Failed: Evicted"),
])
def test_why_a_moved_pod_will_not_run_is_kubelets_own_words(status: Any, said: str) -> None:
    assert failure_of({"status": status}) == said


def test_a_pod_still_coming_up_has_not_failed() -> None:
    assert failure_of({"status": {"phase": "Pending", "containerStatuses": [
        {"name": "app", "state": {"waiting": {"reason": "ContainerCreating"}}}]}}) is None


def test_the_liveness_budget_is_the_tightest_probe() -> None:
    pod = running_pod()
    assert liveness_budget(pod) is None
    pod["spec"]["containers"][0]["livenessProbe"] = {"exec": {"command": ["true"]}}
    assert liveness_budget(pod) == 30                      # Kubernetes' defaults: 10 s x 3
    pod["spec"]["containers"][1]["livenessProbe"] = {"periodSeconds": 2, "failureThreshold": 4}
    assert liveness_budget(pod) == 8
