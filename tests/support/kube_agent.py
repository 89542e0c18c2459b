"""torpor's node installer in the test cluster (tests/support/kube.py), as packaging/kubernetes
makes it: its image built from the Containerfile, its pod from node-installer.yaml, one on each
node, installing and then staying as the node agent `torpor kube migrate` execs into.

- The image: the Containerfile's COPY lines over the test's busybox-static root filesystem (its
  `FROM busybox:1.36` is not reachable here: busybox-static is the same busybox), pushed to the
  cluster's registry.
- The pods: the DaemonSet's pod template, read with `kubectl create --dry-run=client`, bound to
  each node by name (there is no scheduler in the test cluster, so no DaemonSet controller
  places them). Their environment points the installer at the node's own containerd, its config
  and torpor's, and at a state directory of the node's under the test's root (not the host's
  /var/lib/torpor), and at the node containerd's namespaces as the host's (TORPOR_HOST_PID: this
  machine's pid 1 is outside the test's namespaces); torpor is installed already
  (TORPOR_SKIP_INSTALL=1: the test's launchers are the node's torpor), and neither containerd
  nor torpord is (re)started (TORPOR_RESTART and TORPORD none: the config the test wrote has the
  runtime class, so the merge changes nothing).
"""

from __future__ import annotations

import functools
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


def installer_template(cluster: KubeCluster) -> dict[str, Any]:
    out = cluster.kubectl("create", "--dry-run=client", "-o", "json", "-f",
                          str(KUBERNETES / "node-installer.yaml"))
    objects, at = [], 0
    while out[at:].strip():                 # one JSON document per object, one after another
        found, end = json.JSONDecoder().raw_decode(out, at + len(out[at:]) - len(out[at:].lstrip()))
        objects.append(found)
        at = end
    daemonset = next(i for i in objects if i["kind"] == "DaemonSet")
    template: dict[str, Any] = daemonset["spec"]["template"]
    return template


def node_env(cluster: KubeCluster, name: str, state: Path) -> dict[str, str]:
    node = cluster.nodes[name].containerd
    env = {k: v for k, v in node.env.items() if os.environ.get(k) != v}
    env.update({
        "TORPOR_STATE_DIR": str(state), "CONTAINERD_CONFIG": str(node.config_path),
        "CONTAINERD_BIN": node.containerd,
        "PATH": node.env["PATH"], "PREFIX": str(cluster.world.bin.parent),
        "TORPOR_BIN": str(cluster.world.bin / "torpor"), "TORPOR_SKIP_INSTALL": "1",
        "TORPOR_RESTART": "none", "TORPORD": "none",
        "TORPORD_STATE": str(state / "torpord.installed"),
        # the host's namespaces: this machine's pid 1 lies outside the test's (its
        # /proc/1/ns cannot be opened), the node's containerd runs in the host's mount namespace
        "TORPOR_HOST_PID": str(node.proc.pid if node.proc else 1),
    })
    return env


def start_agents(cluster: KubeCluster) -> dict[str, str]:
    """The installer's pod on every node, Ready (it installed); node -> pod name."""
    image = publish_installer(cluster)
    cluster.kubectl("create", "namespace", "torpor-system")
    template = installer_template(cluster)
    pods = {}
    for name in cluster.nodes:
        state = cluster.base / f"agent-state-{name}"
        spec = json.loads(json.dumps(template["spec"]))
        spec.pop("nodeSelector", None)
        spec["nodeName"] = name
        spec.pop("priorityClassName", None)   # no such class without the scheduler's defaults
        container = spec["containers"][0]
        container["image"] = image
        wanted = node_env(cluster, name, state)
        container["env"] = [e for e in container.get("env") or [] if e["name"] not in wanted]
        container["env"] += [{"name": k, "value": v} for k, v in sorted(wanted.items())]
        container["readinessProbe"]["periodSeconds"] = 1
        pods[name] = f"torpor-node-installer-{name}"
        cluster.apply({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": pods[name], "namespace": "torpor-system",
                                    "labels": template["metadata"]["labels"]},
                       "spec": spec})
    for name, pod in pods.items():
        wait_for(functools.partial(_ready, cluster, pod), timeout=120, interval=0.5,
                 what=f"the node installer on {name} to be Ready")
    return pods


def _ready(cluster: KubeCluster, pod: str) -> bool:
    found = json.loads(cluster.kubectl("get", "pod", "-n", "torpor-system", pod, "-o", "json"))
    statuses = found["status"].get("containerStatuses") or []
    for s in statuses:
        ended = s["state"].get("terminated") or s.get("lastState", {}).get("terminated")
        assert not ended, cluster.kubectl("logs", "-n", "torpor-system", pod, "--previous"
                                          if not s["state"].get("terminated") else "--tail=50")
    return bool(statuses) and all(s.get("ready") for s in statuses)


def installer_log(cluster: KubeCluster, pod: str) -> str:
    return cluster.kubectl("logs", "-n", "torpor-system", pod)
