"""One node of the test cluster (tests/support/kube.py): a network namespace joined to the
cluster's bridge, containerd 2.x with CRI and the torpor runtime class in it (a `CriNode`), and a
real kubelet registered with the API server.

What kubelet needs on these machines (../shared notes on kubelet, verified here):
- cgroup v1 (hybrid) is refused unless `failCgroupV1: false`; `cgroupsPerQOS: false` and no
  node allocatable enforcement keep it out of the host's cgroups;
- it writes to /var/lib/kubelet and /var/log/containers whatever its root directory: in its
  mount namespace, empty directories of its own are bind-mounted over /var/lib and /var/log;
- it rewrites three kernel sysctls (kernel.panic, kernel.panic_on_oops, vm.overcommit_memory):
  it runs in a mount namespace of its own (`unshare --mount`) where files holding the values it
  wants are bind-mounted over those /proc/sys entries, with `protectKernelDefaults`, so the
  host's values are never written;
- no webhook authentication without a client of its own: anonymous + AlwaysAllow, on the node's
  own address only (the API server proxies to it, and refuses loopback addresses).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from . import ecosystem
from .containerd import unmount_under
from .cri import CriNode
from .kube_pki import Pki
from .netns import NetNS, ip
from .processes import stop

SYSCTLS = {"kernel/panic": "10", "kernel/panic_on_oops": "1", "vm/overcommit_memory": "1"}
# where kubelet writes whatever its configuration says (/var/lib/kubelet/device-plugins,
# /var/log/containers): directories of its own there, in its mount namespace
HIDDEN = ("/var/lib", "/var/log")


class KubeNode:
    def __init__(self, base: Path, name: str, address: str, port: int, containerd: CriNode,
                 netns: NetNS) -> None:
        self.name = name
        self.address = address            # on the cluster's bridge, e.g. 10.77.0.11
        self.port = port                  # kubelet's API (the API server's node proxy)
        self.containerd = containerd
        self.netns = netns
        self.root = base / f"kubelet-{name}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, pki: Pki, server: str) -> KubeNode:
        self.containerd.start()
        self.root.mkdir(parents=True)
        client = pki.issue(f"kubelet-{self.name}", f"system:node:{self.name}", "system:nodes")
        kubeconfig = pki.kubeconfig(f"kubelet-{self.name}", server, client)
        config = self.root / "kubelet.json"
        config.write_text(json.dumps(self.configuration()))
        mounts = []
        for hidden in HIDDEN:
            own = self.root / "hidden" / hidden.strip("/").replace("/", "-")
            own.mkdir(parents=True)
            mounts.append(f"mount --bind {own} {hidden}")
        for entry, value in SYSCTLS.items():
            held = self.root / f"sysctl-{entry.replace('/', '-')}"
            held.write_text(value + "\n")
            mounts.append(f"mount --bind {held} /proc/sys/{entry}")
        cmd = ["nsenter", f"--net={self.netns.path}", "unshare", "--mount", "--propagation",
               "private", "sh", "-c", " && ".join([*mounts, 'exec "$@"']), "kubelet",
               str(ecosystem.kube_binary("kubelet")), "--config", str(config),
               "--root-dir", str(self.root / "root"), "--cert-dir", str(self.root / "pki"),
               "--kubeconfig", str(kubeconfig), "--hostname-override", self.name,
               "--node-ip", self.address, "--v", "2"]
        with open(self.root / "kubelet.log", "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.containerd.env)
        return self

    def configuration(self) -> dict[str, object]:
        socket = f"unix://{self.containerd.address}"
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.address, "port": self.port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.port + 1,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "failCgroupV1": False, "cgroupsPerQOS": False, "enforceNodeAllocatable": ["none"],
            "protectKernelDefaults": True, "failSwapOn": False,
            "containerRuntimeEndpoint": socket, "imageServiceEndpoint": socket,
            "podLogsDir": str(self.root / "pod-logs"),
            "volumePluginDir": str(self.root / "volume-plugins"),
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%"},
            "featureGates": {"ContainerCheckpoint": True},
        }

    def log_text(self) -> str:
        try:
            return (self.root / "kubelet.log").read_text(errors="replace")
        except OSError:
            return ""

    def checkpoints(self) -> Path:
        """Where this kubelet's checkpoint API writes its archives."""
        return self.root / "root" / "checkpoints"

    def stop(self) -> None:
        """kubelet first (it would restart the pods), then containerd with every pod."""
        if self.proc is not None:
            stop(self.proc)
            self.proc = None
        self.containerd.stop()
        unmount_under(self.root)
        shutil.rmtree(self.root, ignore_errors=True)


def join_bridge(netns: NetNS, bridge_netns: NetNS, bridge: str, address: str) -> None:
    """A veth from `netns` (with `address`, CIDR) to `bridge` in `bridge_netns`."""
    outer, inner = f"{bridge}-{address.split('/')[0].rsplit('.', 1)[1]}", "eth0"
    ip("link", "add", outer, "netns", bridge_netns.name, "type", "veth", "peer", "name", inner,
       "netns", netns.name)
    ip("link", "set", outer, "master", bridge, "up", netns=bridge_netns.name)
    ip("addr", "add", address, "dev", inner, netns=netns.name)
    ip("link", "set", inner, "up", netns=netns.name)


class Daemon:
    """A process of the control plane, in its namespace, its output in a log."""

    def __init__(self, netns: NetNS, log: Path, *cmd: str) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(["nsenter", f"--net={netns.path}", *cmd], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.log.stem} exited:\n{self.log.read_text()[-3000:]}")
