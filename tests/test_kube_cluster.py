"""A pod moved between two nodes of a real Kubernetes cluster, through the API server, as a user
moves it: kube-apiserver, etcd, two kubelets each with its own containerd 2.x
(tests/support/kube.py), the RuntimeClass from packaging/kubernetes, `kubectl`.

The journey: a counter pod of runtime class torpor on node A, a plain runc pod beside it (the
baseline, which must not notice anything); the torpor pod checkpointed through the API server's
node proxy to kubelet's checkpoint API; `torpor kube image` on node A turns kubelet's archive
into the image a pod restores from, pushed to the registry both nodes use; a new pod on node B
from that image: the counter continues, the emptyDir's and /dev/shm's files are back, and once
the original is deleted its Service reaches the new pod, whose memory holds what a client
stored in the original. A pod with a sidecar moves the same way, container by container.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .support import cri, ecosystem
from .support.kube import KubeCluster
from .support.kube_network import ask
from .support.processes import wait_for
from .support.workload import COUNTER
from .support.world import World

pytestmark = pytest.mark.real

RUNTIME_CLASS = Path(__file__).resolve().parents[1] / "packaging" / "kubernetes" / \
    "runtimeclass.yaml"
WORKLOAD = ["sh", "-c", "echo kept > /data/note; echo in-shm > /dev/shm/note; kvserver 7000 & "
            + COUNTER]
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "counter"},
           "spec": {"selector": {"app": "counter"}, "ports": [{"port": 80, "targetPort": 7000}]}}


@pytest.fixture(scope="module")
def kube(world: World) -> Iterator[KubeCluster]:
    missing = ecosystem.kube_missing()
    if missing:
        pytest.skip(f"no Kubernetes binaries ({', '.join(missing)}): `make deps` builds them")
    base = world.base / "kube-cluster"
    base.mkdir()
    cluster = KubeCluster(world, base)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def pod(name: str, node: str, image: str, runtime_class: str | None,
        command: list[str] | None, app: str = "counter") -> dict[str, Any]:
    """A pod bound to `node` (there is no scheduler), its /data an emptyDir."""
    container: dict[str, Any] = {"name": "counter", "image": image,
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    if command:
        container["command"] = command
    spec: dict[str, Any] = {"nodeName": node, "containers": [container],
                            "volumes": [{"name": "data", "emptyDir": {}}],
                            "terminationGracePeriodSeconds": 1}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
            "spec": spec}


def wait_running(kube: KubeCluster, name: str, timeout: float = 120) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        found = kube.pod(name)
        statuses = found["status"].get("containerStatuses") or []
        if statuses and "running" in statuses[0]["state"]:
            return found
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        assert waiting.get("reason") not in ("CreateContainerError", "ErrImagePull",
                                             "CrashLoopBackOff"), json.dumps(found["status"])
        return None

    found = wait_for(running, timeout=timeout, interval=0.5, what=f"pod {name} to run")
    assert isinstance(found, dict)
    return found


def pod_exec(kube: KubeCluster, name: str, *cmd: str, container: str = "counter") -> str:
    return kube.kubectl("exec", name, "-c", container, "--", *cmd).strip()


def counter(kube: KubeCluster, name: str, container: str = "counter") -> int:
    return int(pod_exec(kube, name, "cat", "/tmp/count", container=container))


def counter_above(kube: KubeCluster, name: str, value: int, timeout: float = 30,
                  container: str = "counter") -> int:
    def above() -> int | None:
        try:
            current = counter(kube, name, container)
        except (AssertionError, ValueError):
            return None
        return current if current > value else None

    found = wait_for(above, timeout=timeout, interval=0.3,
                     what=f"{name}/{container}'s counter > {value}")
    assert isinstance(found, int)
    return found


def sandbox_handlers(kube: KubeCluster, node: str) -> dict[str, str]:
    """pod name -> the runtime handler its sandbox runs under, as the node's containerd says."""
    pods = cri.Crictl(kube.nodes[node].containerd).json("pods")["items"]
    return {p["metadata"]["name"]: p["runtimeHandler"] for p in pods if p["state"] == "SANDBOX_READY"}


def endpoints(kube: KubeCluster, service: str) -> list[str]:
    """The ready addresses of the Service's EndpointSlices."""
    slices = json.loads(kube.kubectl("get", "endpointslices", "-l",
                                     f"kubernetes.io/service-name={service}", "-o", "json"))
    return sorted(address for s in slices["items"] for e in s.get("endpoints") or []
                  if e.get("conditions", {}).get("ready") for address in e["addresses"])


def make_image(kube: KubeCluster, archive: Path, name: str) -> str:
    """`torpor kube image` of a kubelet archive on node A (its containerd), pushed over TLS to
    the cluster's registry; the image's reference."""
    assert kube.registry is not None
    ref = f"{kube.registry.host}/checkpoints/{name}:1"
    node_a = kube.nodes["node-a"]
    made = subprocess.run(["nsenter", f"--net={node_a.netns.path}",
                           str(kube.world.bin / "torpor"), "kube", "image", str(archive),
                           "-t", ref, "--ca-file", str(kube.ca)],
                          capture_output=True, text=True, timeout=300,
                          env=node_a.containerd.env)
    assert made.returncode == 0, made.stdout + made.stderr
    return ref


def restarts(found: dict[str, Any]) -> int:
    return int(found["status"]["containerStatuses"][0]["restartCount"])


def test_a_torpor_pod_moves_to_another_node_through_the_api_server(kube: KubeCluster) -> None:
    kube.kubectl("apply", "-f", str(RUNTIME_CLASS))
    assert kube.kubectl("get", "runtimeclass", "torpor", "-o",
                        "jsonpath={.handler}") == "torpor"
    kube.apply(pod("counter", "node-a", kube.workload_image, "torpor", WORKLOAD))
    kube.apply(pod("plain", "node-a", kube.workload_image, None, WORKLOAD, app="baseline"))
    kube.apply(SERVICE)
    original = wait_running(kube, "counter")
    wait_running(kube, "plain")
    node_a = kube.nodes["node-a"]
    assert ask(node_a.netns, original["status"]["podIP"], 7000, "SET k v1") == "OK"
    plain_before = counter_above(kube, "plain", 5)
    before = counter_above(kube, "counter", 5)
    assert sandbox_handlers(kube, "node-a") == {"counter": "torpor", "plain": ""}

    # kubelet's checkpoint API, through the API server's node proxy
    answer = json.loads(kube.kubectl(
        "create", "--raw", "/api/v1/nodes/node-a/proxy/checkpoint/default/counter/counter"
        "?timeout=120", "-f", "/dev/null"))
    archive = Path(answer["items"][0])
    assert archive.parent == kube.nodes["node-a"].checkpoints() and archive.is_file()
    assert counter_above(kube, "counter", before) > before    # it kept running

    ref = make_image(kube, archive, "counter")

    # a new pod on node B from that image: the counter goes on, the files are back
    kube.apply(pod("counter-moved", "node-b", ref, "torpor", None))
    moved = wait_running(kube, "counter-moved")
    first = counter(kube, "counter-moved")
    assert first >= before, f"the counter restarted on node B: {first} < {before}"
    counter_above(kube, "counter-moved", first)
    assert pod_exec(kube, "counter-moved", "cat", "/data/note") == "kept"
    assert pod_exec(kube, "counter-moved", "cat", "/dev/shm/note") == "in-shm"
    assert moved["spec"]["nodeName"] == "node-b"
    assert sandbox_handlers(kube, "node-b") == {"counter-moved": "torpor"}
    assert restarts(kube.pod("counter-moved")) == 0

    # the baseline and the original were not disturbed
    counter_above(kube, "plain", plain_before)
    for name in ("plain", "counter"):
        assert restarts(kube.pod(name)) == 0, json.dumps(kube.pod(name)["status"])

    # the original goes, as in a move: the Service reaches the new pod, and its state
    kube.kubectl("delete", "pod", "counter", "--timeout=60s")
    service_ip = kube.kubectl("get", "service", "counter", "-o", "jsonpath={.spec.clusterIP}")
    wait_for(lambda: endpoints(kube, "counter") == [moved["status"]["podIP"]], timeout=30,
             interval=0.3, what="the Service's endpoints to be the new pod")
    assert wait_for(lambda: ask(node_a.netns, service_ip, 80, "GET k"), timeout=30,
                    interval=0.3, what="an answer through the Service") == "v1"
    for name in ("counter-moved", "plain"):
        kube.kubectl("delete", "pod", name, "--wait=false")
    # kubelet and kube-proxy wanted other kernel settings: the host's were never written
    assert kube.host_sysctls() == kube.sysctls_at_start


def test_a_pod_with_a_sidecar_moves_container_by_container(kube: KubeCluster) -> None:
    """kubelet checkpoints one container per call: each of a two-container pod's containers
    (the instants differ), each turned into its image, and one pod on node B with both."""
    kube.kubectl("apply", "-f", str(RUNTIME_CLASS))
    sidecar = ["sh", "-c", "echo side > /data/side; " + COUNTER]
    spec = pod("pair", "node-a", kube.workload_image, "torpor", WORKLOAD, app="pair")
    spec["spec"]["containers"].append({**spec["spec"]["containers"][0], "name": "sidecar",
                                       "command": sidecar})
    kube.apply(spec)
    wait_running(kube, "pair")
    refs = {}
    for name in ("counter", "sidecar"):
        before = counter_above(kube, "pair", 5, container=name)
        answer = json.loads(kube.kubectl(
            "create", "--raw", f"/api/v1/nodes/node-a/proxy/checkpoint/default/pair/{name}"
            "?timeout=120", "-f", "/dev/null"))
        refs[name] = (make_image(kube, Path(answer["items"][0]), f"pair-{name}"), before)

    moved = pod("pair-moved", "node-b", refs["counter"][0], "torpor", None, app="pair-moved")
    moved["spec"]["containers"].append({**moved["spec"]["containers"][0], "name": "sidecar",
                                        "image": refs["sidecar"][0]})
    kube.apply(moved)
    wait_running(kube, "pair-moved")
    for name, (_, before) in refs.items():
        first = counter(kube, "pair-moved", container=name)
        assert first >= before, f"{name} restarted on node B: {first} < {before}"
        counter_above(kube, "pair-moved", first, container=name)
    assert pod_exec(kube, "pair-moved", "cat", "/data/note", "/data/side") == "kept\nside"
    statuses = kube.pod("pair-moved")["status"]["containerStatuses"]
    assert [s["restartCount"] for s in statuses] == [0, 0], json.dumps(statuses)
    for name in ("pair", "pair-moved"):
        kube.kubectl("delete", "pod", name, "--wait=false")
