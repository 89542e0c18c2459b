"""The real nerdctl (built by packaging/install-deps.sh) against one of the tests' containerd nodes.

Each `Nerdctl` has a containerd namespace, a data root and a CNI configuration directory of its
own, and imports the test image into its namespace. A `bridge` network is a CNI bridge whose
addresses (host-local IPAM) are kept under the same root, not in /var/lib/cni; the bridge device
gets the gateway address, so the test process reaches the containers directly. `close()` removes
every container (nerdctl's postStop hook releases its CNI address), the images, the namespace,
the bridge and the files.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from . import ecosystem, subnets
from .containerd import Node
from .netns import ip
from .processes import printed, wait_for

_instances = itertools.count(1)


class Nerdctl:
    def __init__(self, node: Node, name: str, image_tar: Path) -> None:
        self.node = node
        self.namespace = f"{node.namespace}-nerdctl{next(_instances)}"
        self.root = node.root / "nerdctl" / name
        self.data_root = self.root / "data"
        self.netconf = self.root / "net.d"
        self.netconf.mkdir(parents=True, exist_ok=True)
        self.bridges: list[str] = []
        self.subnets: list[subnets.Subnet] = []
        self.ctr("images", "import", str(image_tar))

    @property
    def env(self) -> dict[str, str]:
        return {**self.node.env, "CONTAINERD_NAMESPACE": self.namespace}

    def __call__(self, *args: str, check: bool = True,
                 timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(ecosystem.tool("nerdctl")), "--address", self.node.address, "--namespace",
               self.namespace, "--data-root", str(self.data_root), "--cni-netconfpath",
               str(self.netconf), "--cni-path", "/usr/lib/cni", *args]
        result = subprocess.run(cmd, capture_output=True, text=True, env=self.env,
                                timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"nerdctl {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout}{result.stderr}")
        return result

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [self.node.ctr_path, "--address", self.node.address, "--namespace", self.namespace,
               *args]
        result = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stdout}{result.stderr}")
        return result

    def bridge(self, name: str) -> tuple[str, str]:
        """A CNI bridge network NAME on a subnet reserved for the test; the subnet's prefix
        ("10.N.0.") and the gateway."""
        subnet = subnets.reserve()
        self.subnets.append(subnet)
        prefix = f"{subnet.net}."
        device = f"tn{uuid.uuid4().hex[:8]}"
        self.bridges.append(device)
        (self.netconf / f"10-{name}.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": name,
            "plugins": [{
                "type": "bridge", "bridge": device, "isGateway": True, "ipMasq": False,
                "ipam": {"type": "host-local", "dataDir": str(self.root / "ipam"),
                         "ranges": [[{"subnet": f"{prefix}0/24", "gateway": f"{prefix}1"}]],
                         "routes": [{"dst": "0.0.0.0/0"}]},
            }],
        }))
        return prefix, f"{prefix}1"

    def container_id(self, name: str) -> str:
        return self("inspect", "-f", "{{.ID}}", name).stdout.strip()

    def status(self, name: str) -> str:
        return self("inspect", "-f", "{{.State.Status}}", name).stdout.strip()

    def exec_out(self, name: str, *cmd: str) -> str:
        return self("exec", name, *cmd).stdout

    def counter(self, name: str) -> int:
        return int(printed(lambda: self.exec_out(name, "cat", "/tmp/count")).strip())

    def wait_counter_above(self, name: str, value: int, timeout: float = 10) -> int:
        def above() -> int | None:
            try:
                current = self.counter(name)
            except (AssertionError, ValueError):
                return None
            return current if current > value else None

        result = wait_for(above, timeout=timeout, what=f"{name}'s counter to pass {value}")
        assert isinstance(result, int)
        return result

    def close(self) -> None:
        ids = self("ps", "-aq", check=False).stdout.split()
        if ids:
            self("rm", "-f", *ids, check=False)
        for image in self.ctr("images", "ls", "-q", check=False).stdout.split():
            self.ctr("images", "rm", "--sync", image, check=False)
        self.ctr("namespaces", "remove", self.namespace, check=False)
        for device in self.bridges:
            ip("link", "delete", device, check=False)
        for subnet in self.subnets:
            subnet.release()
        shutil.rmtree(f"/run/containerd/runc/{self.namespace}", ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)
        if os.path.isdir(self.root):
            raise AssertionError(f"{self.root} could not be removed")
