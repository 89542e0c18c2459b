"""Kubernetes without a kubelet: containerd 2.x's CRI plugin driven by the real crictl.

A `CriNode` is a private containerd 2.x with the CRI plugin, in the test's own network namespace
(so that the registry on 127.0.0.1 is reachable: containerd 2.1.x pulls a restored checkpoint's
base image with its default resolver, which speaks plain HTTP to localhost only), with:

- a CNI bridge of its own (a bridge device the test creates, with the gateway address, so that
  the host reaches the pods without IP forwarding being switched on; host-local IPAM with its
  data under the node's root; Debian's containernetworking-plugins);
- a sandbox ("pause") image built from busybox-static and served by a local registry;
- the `torpor` runtime class (torpor-runc as BinaryName) beside the default `runc`.

`Crictl` runs crictl against one node with a timeout long enough for a CRIU dump (crictl's own
default of 2 s cancels it). Pods and containers are described as CRI JSON, as kubelet would send.
Clean-up removes every pod (so that CNI releases addresses and containerd its network
namespaces) before the node stops, then the bridge.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

from . import ecosystem, images
from .containerd import Node
from .netns import NetNS, ip
from .processes import printed, wait_for
from .registry import Registry

SANDBOX_CMD = ("sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait; done")
SANDBOX_IMAGE = "torpor-test/sandbox:1"
# kubelet's default (no shareProcessNamespace): each container its own PID namespace; crictl's
# default, when the JSON says nothing, is the pod's
LINUX = {"security_context": {"namespace_options": {"pid": 1}}}   # NamespaceMode CONTAINER

NODE_CRI_CONFIG = """
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{sandbox}"
"""


class CriNode(Node):
    """A containerd 2.x node with CRI, a pinned sandbox image and its own CNI bridge."""

    def __init__(self, *args: Any, sandbox_image: str, subnet: int, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "cri": True})
        self.sandbox_image = sandbox_image
        self.subnet = subnet                       # the pods get 10.<subnet>.0.0/24
        self.bridge = f"tcb{uuid.uuid4().hex[:8]}"

    @property
    def gateway(self) -> str:
        return f"10.{self.subnet}.0.1"

    def _config_text(self) -> str:
        return super()._config_text() + NODE_CRI_CONFIG.format(sandbox=self.sandbox_image)

    def start(self) -> CriNode:
        netns = self.netns.name if self.netns else None    # where containerd runs CNI
        ip("link", "add", self.bridge, "type", "bridge", netns=netns)
        ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge, netns=netns)
        ip("link", "set", self.bridge, "up", netns=netns)
        conf_dir = self.root / "cni" / "net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "10-torpor-test.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": f"torpor-{self.name}",
            "plugins": [{
                "type": "bridge", "bridge": self.bridge, "isGateway": False, "ipMasq": False,
                "ipam": {"type": "host-local", "dataDir": str(self.root / "cni" / "ipam"),
                         "ranges": [[{"subnet": f"10.{self.subnet}.0.0/24",
                                      "gateway": self.gateway}]],
                         "routes": [{"dst": "0.0.0.0/0"}]},
            }],
        }))
        super().start()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            crictl = Crictl(self)
            for pod in crictl("pods", "-q", check=False).split():
                crictl("stopp", pod, check=False)
                crictl("rmp", "-f", pod, check=False)
        super().stop()
        ip("link", "del", self.bridge, netns=self.netns.name if self.netns else None,
           check=False)


def start_node(base: Path, name: str, bin_dir: Path, torpor_config: Path, refs: dict[str, str],
               subnet: int, containerd: str = "2", runc: str = "1.1",
               started: list[CriNode] | None = None) -> CriNode:
    """A CRI node of these versions with publish_images' sandbox, the test image pulled;
    appended to `started` before it starts, so that the caller stops it whatever happens."""
    node = CriNode(base / "nodes", name, bin_dir, torpor_config, sandbox_image=refs["sandbox"],
                   subnet=subnet, containerd_bin=ecosystem.containerd_bin(containerd),
                   runc=ecosystem.runc_path(runc))
    if started is not None:
        started.append(node)
    node.start()
    Crictl(node)("pull", refs["workload"])
    return node


class Crictl:
    """The real crictl, against one node."""

    def __init__(self, node: Node, timeout: str = "60s") -> None:
        self.node = node
        self.base = [str(ecosystem.tool("crictl")), "--config", "/dev/null", "-t", timeout,
                     "--runtime-endpoint", f"unix://{node.address}",
                     "--image-endpoint", f"unix://{node.address}"]

    def run(self, *args: str, check: bool = True,
            timeout: float = 180) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*self.base, *args], capture_output=True, text=True,
                                timeout=timeout, env=self.node.env)
        if check and result.returncode != 0:
            raise AssertionError(f"crictl {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout}{result.stderr}")
        return result

    def __call__(self, *args: str, check: bool = True) -> str:
        return self.run(*args, check=check).stdout.strip()

    def json(self, command: str, *args: str) -> Any:
        return json.loads(self(command, "-o", "json", *args))

    def run_pod(self, directory: Path, name: str, handler: str) -> str:
        """A pod (sandbox) with the runtime handler `handler`; its id."""
        pod = directory / f"{name}-pod.json"
        pod.write_text(json.dumps(pod_config(name, directory / f"{name}-logs")))
        return self("runp", "--runtime", handler, str(pod))

    def create(self, pod_id: str, directory: Path, name: str, image: str,
               command: list[str] | None = None, mounts: dict[str, Path] | None = None) -> str:
        """A container in the pod from `image` (an image, a checkpoint archive's path or a
        checkpoint image); its id."""
        config = directory / f"{name}-ctr.json"
        config.write_text(json.dumps(container_config(name, image, command, mounts or {})))
        return self("create", pod_id, str(config), str(directory / f"{name}-pod.json"))

    def pod_ip(self, pod_id: str) -> str:
        return str(self.json("inspectp", pod_id)["status"]["network"]["ip"])

    def exec(self, container_id: str, *cmd: str) -> str:
        return self("exec", "-s", container_id, *cmd)

    def state(self, container_id: str) -> str:
        return str(self.json("inspect", container_id)["status"]["state"])

    def read_counter(self, container_id: str) -> int:
        return int(printed(lambda: self.exec(container_id, "cat", "/tmp/count")))

    def wait_counter_above(self, container_id: str, value: int, timeout: float = 20) -> int:
        def above() -> int | None:
            try:
                current = self.read_counter(container_id)
            except (AssertionError, ValueError):
                return None
            return current if current > value else None

        found = wait_for(above, timeout=timeout, what=f"{container_id[:12]}'s counter > {value}")
        assert isinstance(found, int)
        return found


def pod_config(name: str, log_dir: Path) -> dict[str, Any]:
    log_dir.mkdir(parents=True, exist_ok=True)
    return {"metadata": {"name": name, "namespace": "default", "uid": uuid.uuid4().hex,
                         "attempt": 0},
            "hostname": name, "log_directory": str(log_dir), "linux": LINUX}


def container_config(name: str, image: str, command: list[str] | None,
                     mounts: dict[str, Path]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "metadata": {"name": name}, "image": {"image": image}, "log_path": f"{name}.log",
        "mounts": [{"container_path": path, "host_path": str(source)}
                   for path, source in mounts.items()],
        "linux": LINUX}
    if command:
        config["command"] = command
    return config


def push_layout(layout: Path, ref: str, name: str | None = None,
                netns: NetNS | None = None) -> None:
    """An OCI layout's image into a registry (plain HTTP or unverified TLS), with skopeo
    (from `netns` when the registry is there)."""
    source = f"oci:{layout}" + (f":{name}" if name else "")
    enter = ["nsenter", f"--net={netns.path}"] if netns else []
    subprocess.run([*enter, "skopeo", "copy", "--quiet", "--dest-tls-verify=false", source,
                    f"docker://{ref}"], check=True, capture_output=True, timeout=120)


def publish_images(base: Path, registry: Registry, test_layout: Path) -> dict[str, str]:
    """The sandbox image (built here) and the world's test image, pushed to `registry`."""
    sandbox_layout = base / "sandbox-layout"
    images.write_layout(sandbox_layout, SANDBOX_IMAGE, cmd=SANDBOX_CMD)
    refs = {"sandbox": f"{registry.host}/{SANDBOX_IMAGE}",
            "workload": f"{registry.host}/torpor-test/busybox:1"}
    push_layout(sandbox_layout, refs["sandbox"])
    push_layout(test_layout, refs["workload"])
    return refs
