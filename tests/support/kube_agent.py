"""torpor's node installer in the test cluster (tests/support/kube.py), as packaging/kubernetes
makes it: its image built from the Containerfile, node-installer.yaml applied with kubectl once
every node is labelled torpor.io/node=true; the DaemonSet controller and kube-scheduler place its
pod on each node, where it installs and then stays as the node agent `torpor kube migrate`
execs into.

- The image: the Containerfile's COPY lines over the test's busybox-static root filesystem (its
  `FROM busybox:1.36` is not reachable here: busybox-static is the same busybox), pushed to the
  cluster's registry; the DaemonSet's image set to it.
- Each node's own settings are in its TORPOR_NODE_ENV file (the manifest's per-node settings,
  the DaemonSet pointing at DIR/$(NODE_NAME).env): the node's containerd, its config and
  torpor's, a state directory under the test's root (not the host's /var/lib/torpor), and the
  node containerd's pid as the host's (TORPOR_HOST_PID: this machine's pid 1 is outside the
  test's namespaces, /proc/1/ns cannot be opened); torpor is installed already
  (TORPOR_SKIP_INSTALL=1: the test's launchers are the node's torpor), and neither containerd nor
  torpord is (re)started (TORPOR_RESTART and TORPORD none: the config the test wrote has the
  runtime class, so the merge changes nothing, as the installer's log says).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .images import write_layout
from .processes import wait_for

if TYPE_CHECKING:
    from .kube import KubeCluster

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "packaging" / "kubernetes"


def installer_files(containerfile: Path = KUBERNETES / "Containerfile") -> dict[str, tuple[bytes, int]]:
    """What the Containerfile's COPY lines put in the image: {path: (data, mode)}."""
    files: dict[str, tuple[bytes, int]] = {}
    for line in containerfile.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0].upper() != "COPY":
            continue
        *sources, dest = words[1:]
        for source in sources:
            src = ROOT / source
            if src.is_file():
                target = dest + src.name if dest.endswith("/") else dest
                files[target] = (src.read_bytes(), src.stat().st_mode & 0o777)
                continue
            for path in sorted(src.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    rel = path.relative_to(src)
                    files[f"{dest.rstrip('/')}/{rel}"] = (path.read_bytes(),
                                                          path.stat().st_mode & 0o777)
    return files


def publish_installer(cluster: KubeCluster) -> str:
    layout = cluster.base / "installer-layout"
    write_layout(layout, "torpor-node-installer:0.1.0", installer_files())
    return cluster.publish(layout, "torpor/torpor-node-installer:0.1.0")


def installer_manifest(cluster: KubeCluster) -> list[dict[str, Any]]:
    """node-installer.yaml's objects, as kubectl reads them."""
    out = cluster.kubectl("create", "--dry-run=client", "-o", "json", "-f",
                          str(KUBERNETES / "node-installer.yaml"))
    objects: list[dict[str, Any]] = []
    at = 0
    while out[at:].strip():                 # one JSON document per object, one after another
        found, at = json.JSONDecoder().raw_decode(out, len(out) - len(out[at:].lstrip()))
        objects.append(found)
    return objects


def node_env(cluster: KubeCluster, name: str, state: Path) -> dict[str, str]:
    """The node's own settings (its TORPOR_NODE_ENV file): its containerd, torpor's config, the
    cluster's CA, and where the installer keeps its state."""
    node = cluster.nodes[name].containerd
    env = {k: v for k, v in node.env.items() if os.environ.get(k) != v}
    env.update({
        "TORPOR_STATE_DIR": str(state), "CONTAINERD_CONFIG": str(node.config_path),
        "CONTAINERD_BIN": node.containerd,
        "PATH": node.env["PATH"], "PREFIX": str(cluster.world.bin.parent),
        "TORPOR_BIN": str(cluster.world.bin / "torpor"), "TORPOR_SKIP_INSTALL": "1",
        "TORPOR_DECRYPTION_KEYS": str(cluster.keys_dir(name)),
        "TORPOR_RESTART": "none", "TORPORD": "none",
        "TORPORD_STATE": str(state / "torpord.installed"),
        # the host's namespaces: this machine's pid 1 lies outside the test's (its
        # /proc/1/ns cannot be opened), the node's containerd runs in the host's mount namespace
        "TORPOR_HOST_PID": str(node.proc.pid if node.proc else 1),
    })
    return env


def start_agents(cluster: KubeCluster) -> dict[str, str]:
    """node-installer.yaml applied as a user applies it, once every node is labelled; each
    node's settings in its own TORPOR_NODE_ENV file; the DaemonSet's pod Ready (it installed)
    on every node. node -> its pod's name."""
    image = publish_installer(cluster)
    settings = cluster.base / "node-env"
    settings.mkdir()
    for name in cluster.nodes:
        env = node_env(cluster, name, cluster.base / f"agent-state-{name}")
        (settings / f"{name}.env").write_text(     # KEY=value, literally (node-env.sh)
            "".join(f"{k}={v}\n" for k, v in sorted(env.items())))
        cluster.kubectl("label", "node", name, "torpor.io/node=true")
    manifest = installer_manifest(cluster)
    daemonset = next(i for i in manifest if i["kind"] == "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    container["image"] = image
    for entry in container["env"]:
        if entry["name"] == "TORPOR_NODE_ENV":
            entry["value"] = f"{settings}/$(NODE_NAME).env"
    container["readinessProbe"]["periodSeconds"] = 1
    cluster.kubectl("apply", "-f", "-",
                    input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifest}))
    found: dict[str, str] = {}

    def every_node_ready() -> bool:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", "torpor-system", "-o", "json"))
        for p in pods["items"]:
            _check_alive(cluster, p)
            if all(s.get("ready") for s in p["status"].get("containerStatuses") or [{}]):
                found[p["spec"]["nodeName"]] = p["metadata"]["name"]
        return sorted(found) == sorted(cluster.nodes)

    wait_for(every_node_ready, timeout=180, interval=0.5,
             what="the node installer's DaemonSet to be Ready on every node")
    return found


def agent_on(cluster: KubeCluster, node: str) -> str:
    """The name of the Ready installer pod on `node` ("" while there is none)."""
    pods = json.loads(cluster.kubectl("get", "pods", "-n", "torpor-system", "-o", "json"))
    for p in pods["items"]:
        statuses = p["status"].get("containerStatuses") or []
        if p["spec"].get("nodeName") == node and not p["metadata"].get("deletionTimestamp") \
                and statuses and all(s.get("ready") for s in statuses):
            return str(p["metadata"]["name"])
    return ""


def _check_alive(cluster: KubeCluster, pod: dict[str, Any]) -> None:
    """An installer that ended failed: its log says why."""
    for s in pod["status"].get("containerStatuses") or []:
        ended = s["state"].get("terminated") or s.get("lastState", {}).get("terminated")
        if ended:
            name = pod["metadata"]["name"]
            raise AssertionError(cluster.kubectl_run("logs", "-n", "torpor-system", name,
                                                     "--previous").stdout or
                                 installer_log(cluster, name))


def installer_log(cluster: KubeCluster, pod: str) -> str:
    return cluster.kubectl("logs", "-n", "torpor-system", pod)
