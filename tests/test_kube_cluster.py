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

Then the same moves in one command, `torpor kube migrate`, with torpor's node installer running
on each node as packaging/kubernetes makes it (tests/support/kube_agent.py): a one-container
pod behind a Service, a pod with a sidecar (kept at its source with --keep-source), and a
migration whose new pod cannot start on the target (its registry unreachable from there, or the
nodes' key missing there), which leaves the source running and nothing of the move behind.

Node A encrypts every image it builds for the nodes' key, as its configuration says; the other
nodes' containerd (torpor-decoder) and torpor decrypt them with their copy of that key.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .support import cri, ecosystem, kube_agent
from .support.kube import KubeCluster
from .support.kube_network import ask
from .support.netns import NetNS
from .support.processes import printed, wait_for
from .support.workload import COUNTER
from .support.world import World

pytestmark = pytest.mark.real

RUNTIME_CLASS = Path(__file__).resolve().parents[1] / "packaging" / "kubernetes" / \
    "runtimeclass.yaml"
WORKLOAD = ["sh", "-c", "echo kept > /data/note; echo in-shm > /dev/shm/note; kvserver 7000 & "
            + COUNTER]


def service(app: str) -> dict[str, Any]:
    """A Service named `app` in front of port 7000 of the pods labelled app=`app`."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": app},
            "spec": {"selector": {"app": app}, "ports": [{"port": 80, "targetPort": 7000}]}}


SERVICE = service("counter")


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


def with_sidecar(spec: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """`spec` with a second container, "sidecar": a copy of its first with `fields` changed."""
    first = spec["spec"]["containers"][0]
    spec["spec"]["containers"].append({**first, "name": "sidecar", **fields})
    return spec


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
    return int(printed(lambda: pod_exec(kube, name, "cat", "/tmp/count", container=container)))


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
    (the instants differ, by hand), each turned into its image, and one pod on node B with
    both."""
    kube.kubectl("apply", "-f", str(RUNTIME_CLASS))
    sidecar = ["sh", "-c", "echo side > /data/side; " + COUNTER]
    spec = pod("pair", "node-a", kube.workload_image, "torpor", WORKLOAD, app="pair")
    with_sidecar(spec, command=sidecar)
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
    with_sidecar(moved, image=refs["sidecar"][0])
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


# torpor kube migrate -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def agents(kube: KubeCluster) -> dict[str, str]:
    kube.kubectl("apply", "-f", str(RUNTIME_CLASS))
    pods = kube_agent.start_agents(kube)
    log = kube_agent.installer_log(kube, pods["node-a"])
    assert "containerd's config already has the torpor runtime class" in log, log
    return pods


def migrate(kube: KubeCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`torpor kube migrate` as a user runs it: kubectl and an admin kubeconfig, on the
    control plane's network."""
    assert kube.registry is not None
    cmd = ["nsenter", f"--net={kube.cp.path}", str(kube.world.bin / "torpor"), "kube",
           "migrate", *args, "--registry", f"{kube.registry.host}/migrated",
           "--kubeconfig", str(kube.admin), "--kubectl", str(ecosystem.kube_binary("kubectl")),
           "--timeout", "120s"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=kube.nodes["node-a"].containerd.env)


def moved_from(kube: KubeCluster, source: str) -> list[dict[str, Any]]:
    """The pods made by a migration of `source` (NAMESPACE/POD)."""
    pods = json.loads(kube.kubectl("get", "pods", "-o", "json"))["items"]
    return [p for p in pods if (p["metadata"].get("annotations") or {})
            .get("torpor.io/migrated-from", "").startswith(source + "@")]


def in_registry(kube: KubeCluster, image: str) -> bool:
    """Whether the registry's storage holds REGISTRY/REPO:TAG@sha256:HEX's manifest."""
    assert kube.registry is not None
    repository = image.split("/", 1)[1].split("@")[0].split(":")[0]
    return (kube.registry.storage / "docker/registry/v2/repositories" / repository /
            "_manifests/revisions/sha256" / image.rsplit("sha256:", 1)[1] / "link").exists()


def registry_blob(kube: KubeCluster, digest: str) -> bytes:
    assert kube.registry is not None
    hex_part = digest.split(":", 1)[1]
    return (kube.registry.storage / "docker/registry/v2/blobs/sha256" / hex_part[:2] /
            hex_part / "data").read_bytes()


def sealed_for_the_nodes(kube: KubeCluster, image: str) -> list[str]:
    """The media types of the layers of REGISTRY/REPO@sha256:HEX (every manifest of an index),
    as the registry stores them, once checked that each is encrypted or one of the workload's
    base image (node A's [image] encrypt_recipients)."""
    assert kube.registry is not None
    base = kube.registry.storage / "docker/registry/v2/repositories/torpor-test/busybox/_layers"
    found: list[str] = []
    todo = [image.rsplit("@", 1)[1]]
    while todo:
        document = json.loads(registry_blob(kube, todo.pop()))
        todo += [m["digest"] for m in document.get("manifests") or []
                 if not m.get("artifactType", "").endswith("signature")]
        for layer in document.get("layers") or []:
            clear = not layer["mediaType"].endswith("+encrypted")
            assert not clear or (base / "sha256" / layer["digest"].split(":")[1]).exists() or \
                layer["mediaType"].startswith("application/vnd.dev.cosign"), layer
            found.append(layer["mediaType"])
    return found


def no_archives_left(kube: KubeCluster, name: str) -> None:
    """None of kubelet's archives of the pod `name` (default namespace) stays on node A."""
    where = kube.nodes["node-a"].checkpoints()
    left = sorted(where.glob(f"checkpoint-{name}_default-*")) if where.exists() else []
    assert left == []


def the_source_lived_and_nothing_is_left(kube: KubeCluster, name: str, before: int) -> None:
    """After a failed migration of default/`name`: its new pod removed, the source counting on
    from `before` with no restart, no archive left on node A; then the source is deleted."""
    wait_for(lambda: moved_from(kube, f"default/{name}") == [], timeout=60, interval=0.5,
             what="the failed migration's pod to be removed")
    assert restarts(kube.pod(name)) == 0
    counter_above(kube, name, before)
    no_archives_left(kube, name)
    kube.kubectl("delete", "pod", name, "--wait=false")


def test_torpor_kube_migrate_moves_a_pod_behind_a_service(kube: KubeCluster,
                                                           agents: dict[str, str]) -> None:
    kube.apply(pod("web", "node-a", kube.workload_image, "torpor", WORKLOAD, app="web"))
    kube.apply(service("web"))
    original = wait_running(kube, "web")
    node_a = kube.nodes["node-a"]
    assert ask(node_a.netns, original["status"]["podIP"], 7000, "SET k v1") == "OK"
    before = counter_above(kube, "web", 5)

    done = migrate(kube, "default/web", "--to", "node-b")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "moved default/web from node-a to node-b as web-" in done.stdout, done.stdout
    for step in ("checkpointing counter through kubelet on node-a",
                 "building and pushing", "waiting for default/web-"):
        assert step in done.stderr + done.stdout, done.stderr

    [moved] = moved_from(kube, "default/web")
    name = moved["metadata"]["name"]
    assert moved["spec"]["nodeName"] == "node-b"
    first = counter(kube, name)
    assert first >= before, f"the counter restarted on node B: {first} < {before}"
    counter_above(kube, name, first)
    assert pod_exec(kube, name, "cat", "/data/note") == "kept"
    assert pod_exec(kube, name, "cat", "/dev/shm/note") == "in-shm"
    assert pod_exec(kube, name, "hostname") == "web"
    assert restarts(kube.pod(name)) == 0
    assert all(in_registry(kube, c["image"]) for c in moved["spec"]["containers"])
    # node A encrypts what it pushes, as its configuration says; node B's containerd decrypted
    # it as it pulled it (torpor-decoder, with B's key)
    [image] = [c["image"] for c in moved["spec"]["containers"]]
    assert sealed_for_the_nodes(kube, image) == [
        "application/vnd.oci.image.layer.v1.tar+zstd+encrypted"]
    # the original is gone, the Service reaches the moved pod and the memory it holds
    wait_for(lambda: kube.kubectl_run("get", "pod", "web").returncode != 0, timeout=60,
             interval=0.5, what="the original pod to be deleted")
    service_ip = kube.kubectl("get", "service", "web", "-o", "jsonpath={.spec.clusterIP}")
    wait_for(lambda: endpoints(kube, "web") == [kube.pod(name)["status"]["podIP"]], timeout=30,
             interval=0.3, what="the Service's endpoints to be the moved pod")
    assert wait_for(lambda: ask(node_a.netns, service_ip, 80, "GET k"), timeout=30,
                    interval=0.3, what="an answer through the Service") == "v1"
    no_archives_left(kube, "web")   # kubelet's archive never stays on the node
    kube.kubectl("delete", "pod", name, "--wait=false")
    kube.kubectl("delete", "service", "web")


def test_torpor_kube_migrate_moves_a_pod_with_a_sidecar_and_can_keep_the_source(
        kube: KubeCluster, agents: dict[str, str]) -> None:
    sidecar = ["sh", "-c", "echo side > /data/side; " + COUNTER]
    spec = pod("duo", "node-a", kube.workload_image, "torpor", WORKLOAD, app="duo")
    with_sidecar(spec, command=sidecar)
    kube.apply(spec)
    wait_running(kube, "duo")
    before = {c: counter_above(kube, "duo", 5, container=c) for c in ("counter", "sidecar")}

    done = migrate(kube, "duo", "--to", "node-b", "--keep-source", "--name", "duo-b")
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stderr     # the pod frozen once for both checkpoints, then thawed
    assert said.index("froze counter sidecar at one instant") < \
        said.index("checkpointing counter") < said.index("checkpointing sidecar") < \
        said.index("thawed the pod after") < said.index("building and pushing"), said
    result = json.loads(kube.kubectl("get", "pod", "duo-b", "-o", "json"))
    assert result["metadata"]["annotations"]["torpor.io/migrated-from"] == "default/duo@node-a"
    images = {c["name"]: c["image"] for c in result["spec"]["containers"]}
    assert sorted(images) == ["counter", "sidecar"] and all(
        f"/migrated/default/duo/{name}:" in ref for name, ref in images.items())

    wait_running(kube, "duo-b")
    for name, value in before.items():
        first = counter(kube, "duo-b", container=name)
        assert first >= value, f"{name} restarted on node B: {first} < {value}"
        counter_above(kube, "duo-b", first, container=name)
    assert pod_exec(kube, "duo-b", "cat", "/data/note", "/data/side") == "kept\nside"
    for name in ("duo", "duo-b"):      # the source kept running, untouched
        statuses = kube.pod(name)["status"]["containerStatuses"]
        assert [s["restartCount"] for s in statuses] == [0, 0], json.dumps(statuses)
    for name in ("counter", "sidecar"):  # thawed: both of the source's containers count on
        now = counter(kube, "duo", container=name)
        counter_above(kube, "duo", now, container=name)
    no_archives_left(kube, "duo")
    for name in ("duo", "duo-b"):
        kube.kubectl("delete", "pod", name, "--wait=false")


def test_a_migration_that_fails_on_the_target_leaves_the_source_running(
        kube: KubeCluster, agents: dict[str, str]) -> None:
    """node B cannot reach the registry (its connections to it are refused): the images are
    pushed from node A, the new pod cannot pull them. migrate fails with kubelet's reason, the
    new pod is removed, the archive and the images pushed too, and the source never noticed."""
    assert kube.registry is not None
    kube.apply(pod("solo", "node-a", kube.workload_image, "torpor", WORKLOAD, app="solo"))
    wait_running(kube, "solo")
    before = counter_above(kube, "solo", 3)
    node_b: NetNS = kube.nodes["node-b"].netns
    host, port = kube.registry.host.rsplit(":", 1)
    rule = ["OUTPUT", "-p", "tcp", "-d", host, "--dport", port, "-j", "REJECT",
            "--reject-with", "tcp-reset"]
    node_b.run("iptables", "-I", *rule)
    try:
        done = migrate(kube, "default/solo", "--to", "node-b")
    finally:
        node_b.run("iptables", "-D", *rule)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the moved pod default/solo-" in done.stderr and "did not start" in done.stderr, \
        done.stderr
    assert "ErrImagePull" in done.stderr or "ImagePullBackOff" in done.stderr, done.stderr
    pushed = re.findall(r"(\S+/migrated/default/solo/\S+@sha256:[0-9a-f]{64})", done.stderr)
    assert pushed, done.stderr
    for image in pushed:     # what it pushed is deleted from the registry (by digest)
        assert not in_registry(kube, image), image
    the_source_lived_and_nothing_is_left(kube, "solo", before)


def test_a_target_without_the_nodes_key_cannot_open_the_move_and_the_source_lives(
        kube: KubeCluster, agents: dict[str, str]) -> None:
    """Node A encrypts what it pushes for the nodes' key; node B without that key (its key
    directory emptied) cannot unpack the image: migrate fails with kubelet's ErrImagePull and
    torpor-decoder's words from B's containerd, removes what it made, and the source counts
    on."""
    kube.apply(pod("sealed", "node-a", kube.workload_image, "torpor", WORKLOAD, app="sealed"))
    wait_running(kube, "sealed")
    before = counter_above(kube, "sealed", 3)
    key = kube.keys_dir("node-b") / "nodes.pem"
    aside = key.with_name(".nodes.pem")                  # hidden: not a key of the directory
    key.rename(aside)
    try:
        done = migrate(kube, "default/sealed", "--to", "node-b")
    finally:
        aside.rename(key)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ErrImagePull" in done.stderr, done.stderr
    assert "torpor-decoder: layer sha256:" in done.stderr and \
        "this node holds no private key" in done.stderr, done.stderr
    the_source_lived_and_nothing_is_left(kube, "sealed", before)


def test_migrate_refuses_in_words_before_anything_is_made(kube: KubeCluster,
                                                          agents: dict[str, str]) -> None:
    done = migrate(kube, "default/nowhere", "--to", "node-b")
    assert done.returncode == 1 and "reading pod default/nowhere" in done.stderr, done.stderr
    assert "NotFound" in done.stderr or "not found" in done.stderr, done.stderr


def cri_tasks(kube: KubeCluster, node: str) -> dict[str, str]:
    """Task id -> status in the node's CRI namespace, as `ctr task ls` says."""
    containerd = kube.nodes[node].containerd
    out = subprocess.run([containerd.ctr_path, "--address", containerd.address, "-n", "k8s.io",
                          "task", "ls"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0]: line.split()[-1] for line in out.splitlines()[1:] if line.strip()}


def test_a_pod_frozen_for_a_migration_thaws_when_its_holder_goes_away(
        kube: KubeCluster, agents: dict[str, str]) -> None:
    """`torpor kube freeze` through the agent, as migrate holds it; its kubectl SIGKILLed (the
    migration died): the pod's containers count on again, each of them."""
    sidecar = ["sh", "-c", COUNTER]
    spec = pod("held", "node-a", kube.workload_image, "torpor", WORKLOAD, app="held")
    with_sidecar(spec, command=sidecar)
    kube.apply(spec)
    found = wait_running(kube, "held")
    for name in ("counter", "sidecar"):
        counter_above(kube, "held", 2, container=name)
    holder = subprocess.Popen(
        ["nsenter", f"--net={kube.cp.path}", str(ecosystem.kube_binary("kubectl")),
         "--kubeconfig", str(kube.admin), "exec", "-i", "-n", "torpor-system",
         agents["node-a"], "-c", "install", "--", "/bin/sh",
         "/installer/torpor/packaging/kubernetes/node-agent.sh", "freeze",
         found["metadata"]["uid"], "600"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "frozen counter sidecar"
        assert sorted(cri_tasks(kube, "node-a").values()).count("PAUSED") == 2
    finally:
        holder.kill()                  # SIGKILL: no goodbye, only the stream's end
        holder.wait()
    wait_for(lambda: "PAUSED" not in cri_tasks(kube, "node-a").values(), timeout=30,
             interval=0.3, what="the pod to thaw once its holder is gone")
    for name in ("counter", "sidecar"):
        now = counter(kube, "held", container=name)
        counter_above(kube, "held", now, container=name)
    kube.kubectl("delete", "pod", "held", "--wait=false")


def test_torpor_kube_migrate_to_containerd_2_4_restores_on_create(
        kube: KubeCluster, agents: dict[str, str]) -> None:
    """containerd 2.4 no longer restores through CreateContainer: node C's torpor does, where
    its `[restore] on_create = "signed"` allows it. migrate asks node C's agent, builds a torpor
    checkpoint image on node A (signed with A's key, which C trusts), and kubelet's plain
    CreateContainer on C restores it."""
    kube.apply(pod("far", "node-a", kube.workload_image, "torpor", WORKLOAD, app="far"))
    wait_running(kube, "far")
    before = counter_above(kube, "far", 5)

    done = migrate(kube, "default/far", "--to", "node-c", "--name", "far-c")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "node-c (containerd 2.4" in done.stderr and \
        "restores through torpor's restore on create (signed)" in done.stderr, done.stderr
    wait_running(kube, "far-c")
    first = counter(kube, "far-c")
    assert first >= before, f"the counter restarted on node C: {first} < {before}"
    counter_above(kube, "far-c", first)
    assert pod_exec(kube, "far-c", "cat", "/data/note") == "kept"
    assert pod_exec(kube, "far-c", "cat", "/dev/shm/note") == "in-shm"
    assert restarts(kube.pod("far-c")) == 0
    assert sandbox_handlers(kube, "node-c")["far-c"] == "torpor"
    # encrypted on node A, as its configuration says: the read-write layer (containerd's
    # torpor-decoder on C opened it) and every state layer (C's torpor-runc opened them)
    [image] = [c["image"] for c in kube.pod("far-c")["spec"]["containers"]]
    sealed = sealed_for_the_nodes(kube, image)
    assert "application/vnd.oci.image.layer.v1.tar+zstd+encrypted" in sealed, sealed
    assert any(t.startswith("application/vnd.torpor") and t.endswith("+encrypted")
               for t in sealed), sealed
    wait_for(lambda: kube.kubectl_run("get", "pod", "far").returncode != 0, timeout=60,
             interval=0.5, what="the original pod to be deleted")
    no_archives_left(kube, "far")
    kube.kubectl("delete", "pod", "far-c", "--wait=false")


def test_migrate_to_a_node_that_cannot_restore_is_refused_before_anything_is_made(
        kube: KubeCluster, agents: dict[str, str]) -> None:
    """Node C with `[restore] on_create = "off"`: its containerd 2.4 cannot restore, so
    migrate says so, and checkpoints nothing; nor does it move a pod of plain runc, nor freeze
    a pod whose liveness probes would not survive it."""
    config = kube.nodes["node-c"].containerd.torpor_config
    kept = config.read_text()
    config.write_text(kept.replace('on_create = "signed"', 'on_create = "off"'))
    try:
        kube.apply(pod("stay", "node-a", kube.workload_image, "torpor", WORKLOAD, app="stay"))
        wait_running(kube, "stay")
        done = migrate(kube, "default/stay", "--to", "node-c")
    finally:
        config.write_text(kept)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "node node-c (containerd 2.4" in done.stderr and \
        'on_create is "off": set it to "signed"' in done.stderr, done.stderr
    assert "checkpointing" not in done.stderr
    assert moved_from(kube, "default/stay") == []
    assert restarts(kube.pod("stay")) == 0
    kube.kubectl("delete", "pod", "stay", "--wait=false")

    # a plain runc pod: kubelet's archive of it holds no emptyDir, and on node C it would
    # start cold; refused, whatever the target
    kube.apply(pod("bare", "node-a", kube.workload_image, None, WORKLOAD, app="bare"))
    wait_running(kube, "bare")
    done = migrate(kube, "default/bare", "--to", "node-b")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "runs under no runtime class (plain runc)" in done.stderr, done.stderr
    assert "checkpointing" not in done.stderr and moved_from(kube, "default/bare") == []
    kube.kubectl("delete", "pod", "bare", "--wait=false")

    # two containers whose liveness probes allow 3 s without an answer: too short to freeze
    spec = pod("tight", "node-a", kube.workload_image, "torpor", WORKLOAD, app="tight")
    probe = {"exec": {"command": ["true"]}, "periodSeconds": 1, "failureThreshold": 3}
    spec["spec"]["containers"][0]["livenessProbe"] = probe
    with_sidecar(spec, command=["sh", "-c", COUNTER])
    kube.apply(spec)
    wait_running(kube, "tight")
    done = migrate(kube, "default/tight", "--to", "node-b")
    assert done.returncode == 1 and "liveness probes allow 3s" in done.stderr, done.stderr
    assert "checkpointing" not in done.stderr and moved_from(kube, "default/tight") == []
    assert "PAUSED" not in cri_tasks(kube, "node-a").values()
    kube.kubectl("delete", "pod", "tight", "--wait=false")


def test_a_pod_frozen_for_a_migration_thaws_when_the_agent_pod_is_restarted(
        kube: KubeCluster, agents: dict[str, str]) -> None:
    """The node agent's pod deleted mid-hold (as a DaemonSet update does): every process in it
    goes, the holder too, with no chance to resume; its guard, outside the agent's cgroups,
    resumes the pod. The DaemonSet then brings the agent back."""
    spec = pod("held2", "node-b", kube.workload_image, "torpor", WORKLOAD, app="held2")
    with_sidecar(spec, command=["sh", "-c", COUNTER])
    kube.apply(spec)
    found = wait_running(kube, "held2")
    agent = kube_agent.agent_on(kube, "node-b")
    holder = subprocess.Popen(
        ["nsenter", f"--net={kube.cp.path}", str(ecosystem.kube_binary("kubectl")),
         "--kubeconfig", str(kube.admin), "exec", "-i", "-n", "torpor-system", agent, "-c",
         "install", "--", "/bin/sh", "/installer/torpor/packaging/kubernetes/node-agent.sh",
         "freeze", found["metadata"]["uid"], "600"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "frozen counter sidecar"
        assert sorted(cri_tasks(kube, "node-b").values()).count("PAUSED") == 2
        kube.kubectl("delete", "pod", "-n", "torpor-system", agent, "--grace-period=1")
        wait_for(lambda: "PAUSED" not in cri_tasks(kube, "node-b").values(), timeout=30,
                 interval=0.3, what="the pod to thaw once the agent's pod is gone")
    finally:
        holder.kill()
        holder.wait()
    for name in ("counter", "sidecar"):
        now = counter(kube, "held2", container=name)
        counter_above(kube, "held2", now, container=name)
    kube.kubectl("delete", "pod", "held2", "--wait=false")
    wait_for(lambda: kube_agent.agent_on(kube, "node-b") not in ("", agent), timeout=120,
             interval=0.5, what="the DaemonSet to bring node B's agent back")
