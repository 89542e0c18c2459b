"""Services in the test cluster (tests/support/kube.py): what makes a Service's ClusterIP reach
its pods on any node.

- kube-controller-manager in the control plane's namespace, with the EndpointSlice and
  DaemonSet controllers only (no serving port, no leader election): a Service's EndpointSlice
  follows its Ready pods, and torpor's node installer (a DaemonSet) gets its pods;
- kube-proxy (iptables mode) in each node's namespace, as `system:kube-proxy` (RBAC's
  `system:node-proxier`), with conntrack left as it is (`maxPerCore: 0`, no timeouts: those are
  the machine's, not the namespace's); its iptables rules and sysctls are the namespace's own;
- routes between the nodes' pod networks, the service range on the cluster's bridge, and IP
  forwarding in each node's namespace (each namespace has its own setting).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from . import ecosystem
from .kube_node import Daemon, KubeNode
from .kube_pki import Pki
from .netns import NetNS, ip

SERVICE_RANGE = "10.96.0.0/24"


def pod_subnet(node: KubeNode) -> str:
    return f"10.{node.containerd.subnet}.0.0/24"


def route_between(nodes: list[KubeNode]) -> None:
    for node in nodes:
        subprocess.run(["nsenter", f"--net={node.netns.path}", "sysctl", "-q", "-w",
                        "net.ipv4.ip_forward=1"], check=True, capture_output=True)
        ip("route", "add", SERVICE_RANGE, "dev", "eth0", netns=node.netns.name)
        for other in nodes:
            if other is not node:
                ip("route", "add", pod_subnet(other), "via", other.address,
                   netns=node.netns.name)


def start_controller_manager(pki: Pki, server: str, cp: NetNS, base: Path) -> Daemon:
    # its own user; in system:masters, as it runs every loop with one credential
    client = pki.issue("controller-manager", "system:kube-controller-manager", "system:masters")
    return Daemon(cp, base / "kube-controller-manager.log",
                  str(ecosystem.kube_binary("kube-controller-manager")),
                  "--kubeconfig", str(pki.kubeconfig("controller-manager", server, client)),
                  "--controllers", "endpointslice,daemonset", "--leader-elect=false",
                  "--secure-port", "0")


def start_proxy(pki: Pki, server: str, node: KubeNode) -> Daemon:
    client = pki.issue(f"proxy-{node.name}", "system:kube-proxy")
    config = node.root / "kube-proxy.json"
    config.write_text(json.dumps({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(pki.kubeconfig(f"proxy-{node.name}", server,
                                                              client))},
        "hostnameOverride": node.name, "mode": "iptables",
        "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
    }))
    return Daemon(node.netns, node.root / "kube-proxy.log",
                  str(ecosystem.kube_binary("kube-proxy")), "--config", str(config))


def ask(netns: NetNS, host: str, port: int, line: str, timeout: float = 10) -> str:
    """One request over a new TCP connection from `netns`; the answer's first line ("" when
    the connection failed)."""
    code = ("import socket, sys\n"
            "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))\n"
            "s.sendall(sys.argv[3].encode() + b'\\n')\n"
            "print(s.makefile().readline().strip())\n")
    result = subprocess.run(["nsenter", f"--net={netns.path}", "python3", "-c", code, host,
                             str(port), line, str(timeout)],
                            capture_output=True, text=True, timeout=timeout + 10)
    return result.stdout.strip() if result.returncode == 0 else ""
