"""A small real Kubernetes cluster on temporary roots: one API server and three kubelets.

- The control plane's network namespace holds etcd (on its 127.0.0.1), kube-apiserver (:6443,
  `--authorization-mode=Node,RBAC`, privileged pods allowed), a registry (TLS, its certificate
  from the cluster's CA) and the bridge the nodes join (10.77.0.0/24, the API server at .1). The
  host's networks are not touched.
- Each node (tests/support/kube_node.py) is a namespace of its own on that bridge (.11, .12,
  .13), with its own containerd (2.1 on A and B, 2.4 over runc 1.3 on C; CRI, the torpor runtime
  class from `torpor runtime-config`, a CNI bridge for its pods) and its own kubelet. Every node
  signs what it pushes with the cluster's key and trusts it; C restores signed checkpoints on
  create. containerd trusts the cluster's CA (SSL_CERT_FILE),
  for pulls and for the base image a restore pulls by digest.
- Encryption as a node's configuration says: node A encrypts every checkpoint image it builds for
  the nodes' key (`[image] encrypt_recipients`); every node holds that key's private half in its
  own key directory (`keys-NODE/`), which its containerd's stream processor (torpor-decoder) and
  its torpor (`[restore] decryption_keys`) read.
- Services work (tests/support/kube_network.py): kube-controller-manager (EndpointSlices and
  DaemonSets only) beside the API server, kube-proxy in each node's namespace, routes between
  the nodes' pods; kube-scheduler places what a controller makes (the tests' pods name their
  node).
- `kubectl` runs in the control plane's namespace with an admin kubeconfig (`system:masters`).

Everything is stopped by pid: the kube-proxies, the kubelets, then each containerd with its
pods, kube-controller-manager, the API server before etcd (its shutdown hangs once etcd is gone:
SIGKILL after 5 s), the registry; then the namespaces (with their bridges and veths) and the
files.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import tomlkit

from . import ecosystem, kube_network
from .cri import SANDBOX_CMD, SANDBOX_IMAGE, CriNode, push_layout
from .images import write_layout
from .kube_node import SYSCTLS, Daemon, KubeNode, join_bridge
from .kube_pki import Pki
from .netns import NetNS, ip
from .processes import stop, wait_for
from .registry import Registry
from .world import World

NET = "10.77.0"
API_SERVER = f"https://{NET}.1:6443"
# name, address, kubelet's port, pod subnet, containerd (ecosystem.CONTAINERD_VERSIONS)
NODES = (("node-a", 11, 10250, 201, "2"), ("node-b", 12, 10260, 202, "2"),
         ("node-c", 13, 10270, 203, "2.4"))


class KubeCluster:
    def __init__(self, world: World, base: Path) -> None:
        self.world = world
        self.base = base
        self.pki = Pki(base / "pki")
        self.admin = self.pki.kubeconfig("admin", API_SERVER,
                                         self.pki.issue("admin", "torpor-test-admin",
                                                        "system:masters"))
        self.bridge = "tkbr0"
        self.daemons: list[Daemon] = []
        self.sysctls_at_start = self.host_sysctls()
        self.signer = self.pki.signing_key("checkpoint-signer")
        self.node_key = self.pki.signing_key("nodes-encryption")   # EC P-256, PKCS#8
        self.nodes: dict[str, KubeNode] = {}
        self.proxies: list[Daemon] = []
        self.registry: Registry | None = None
        self.workload_image = ""
        self.cp = NetNS("torpor-kcp")    # last: stop() removes it
        self.namespaces = [self.cp]

    @staticmethod
    def host_sysctls() -> dict[str, str]:
        """The host's settings kubelet and kube-proxy would change on a node of their own."""
        return {entry: (Path("/proc/sys") / entry).read_text()
                for entry in (*SYSCTLS, "net/netfilter/nf_conntrack_max")}

    @property
    def ca(self) -> Path:
        return self.pki.ca.cert

    def start(self) -> KubeCluster:
        ip("link", "add", self.bridge, "type", "bridge", netns=self.cp.name)
        ip("addr", "add", f"{NET}.1/24", "dev", self.bridge, netns=self.cp.name)
        ip("link", "set", self.bridge, "up", netns=self.cp.name)
        self._start_control_plane()
        self.registry = Registry(self.base, "registry", netns=self.cp, address=f"{NET}.1",
                                 certificate=self._pair("registry", ips=(f"{NET}.1",)))
        self.registry.start()
        write_layout(self.base / "sandbox-layout", SANDBOX_IMAGE, cmd=SANDBOX_CMD)
        sandbox = self.publish(self.base / "sandbox-layout", SANDBOX_IMAGE)
        self.workload_image = self.publish(self.world.image_layout, "torpor-test/busybox:1")
        for name, host, port, subnet, version in NODES:
            netns = NetNS("torpor-kn")
            self.namespaces.append(netns)
            join_bridge(netns, self.cp, self.bridge, f"{NET}.{host}/24")
            containerd = CriNode(self.base / "nodes", name, self.world.bin,
                                 self._torpor_config(name, version), netns=netns,
                                 decryption_keys=self.keys_dir(name),
                                 sandbox_image=sandbox, subnet=subnet,
                                 containerd_bin=ecosystem.containerd_bin(version),
                                 runc=ecosystem.runc_path("1.3") if version == "2.4" else None,
                                 extra_env={"SSL_CERT_FILE": str(self.ca)})
            node = KubeNode(self.base, name, f"{NET}.{host}", port, containerd, netns)
            self.nodes[name] = node
            node.start(self.pki, API_SERVER)
        for node in self.nodes.values():
            self._wait_ready(node)
        kube_network.route_between(list(self.nodes.values()))
        self.daemons.append(kube_network.start_controller_manager(self.pki, API_SERVER, self.cp,
                                                                  self.base))
        self.daemons.append(self._start_scheduler())
        self.proxies = [kube_network.start_proxy(self.pki, API_SERVER, node)
                        for node in self.nodes.values()]
        return self

    def _start_scheduler(self) -> Daemon:
        """kube-scheduler, for the pods a controller makes (the node installer's DaemonSet);
        the tests' own pods name their node."""
        client = self.pki.issue("scheduler", "system:kube-scheduler", "system:masters")
        return Daemon(self.cp, self.base / "kube-scheduler.log",
                      str(ecosystem.kube_binary("kube-scheduler")),
                      "--kubeconfig", str(self.pki.kubeconfig("scheduler", API_SERVER, client)),
                      "--leader-elect=false", "--secure-port", "0")

    def _torpor_config(self, name: str, version: str) -> Path:
        """The world's torpor config, plus: every node signs what it pushes with the cluster's
        key and trusts it; a containerd that does not restore pods itself (2.4) restores signed
        checkpoints on create."""
        config = tomllib.loads(self.world.config.read_text())
        image = config.setdefault("image", {})
        image["signing_key"] = str(self.signer)
        if name == "node-a":
            image["encrypt_recipients"] = [f"jwe:{self.node_key.with_suffix('.pub')}"]
        restore = config.setdefault("restore", {})
        restore["trusted_keys"] = [str(self.signer.with_suffix(".pub"))]
        restore["decryption_keys"] = [str(self.keys_dir(name))]
        if version == "2.4":
            restore["on_create"] = "signed"
        path = self.base / f"torpor-{name}.toml"
        path.write_text(tomlkit.dumps(config))
        return path

    def keys_dir(self, name: str) -> Path:
        """The node's private keys (containerd's /etc/containerd/ocicrypt/keys, on a node of
        its own): the nodes' encryption key."""
        keys = self.base / f"keys-{name}"
        if not keys.exists():
            keys.mkdir(mode=0o700)
            (keys / "nodes.pem").write_bytes(self.node_key.read_bytes())
            (keys / "nodes.pem").chmod(0o600)
        return keys

    def _wait_ready(self, node: KubeNode) -> None:
        wait_for(lambda: self._ready(node), timeout=120, interval=0.5,
                 what=f"{node.name} to register and be Ready ({node.root}/kubelet.log)")

    def _pair(self, name: str, ips: tuple[str, ...]) -> tuple[Path, Path]:
        pair = self.pki.issue(name, name, ips=ips)
        return pair.cert, pair.key

    def _start_control_plane(self) -> None:
        etcd_url = "http://127.0.0.1:2379"
        etcd = Daemon(self.cp, self.base / "etcd.log", str(ecosystem.kube_binary("etcd")),
                      "--name", "torpor-test", "--data-dir", str(self.base / "etcd"),
                      "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                      "--listen-peer-urls", "http://127.0.0.1:2380",
                      "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                      "--initial-cluster", "torpor-test=http://127.0.0.1:2380",
                      "--unsafe-no-fsync")
        self.daemons.append(etcd)
        serving = self.pki.issue("apiserver", "kube-apiserver", ips=(f"{NET}.1", "127.0.0.1",
                                                                     "10.96.0.1"),
                                 dns=("kubernetes", "kubernetes.default", "localhost"))
        to_kubelets = self.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                     "system:masters")
        sa = self.pki.service_account
        self.daemons.append(Daemon(
            self.cp, self.base / "kube-apiserver.log", str(ecosystem.kube_binary("kube-apiserver")),
            "--etcd-servers", etcd_url, "--bind-address", "0.0.0.0", "--secure-port", "6443",
            "--advertise-address", f"{NET}.1", "--cert-dir", str(self.base / "apiserver"),
            "--tls-cert-file", str(serving.cert), "--tls-private-key-file", str(serving.key),
            "--client-ca-file", str(self.ca),
            "--kubelet-client-certificate", str(to_kubelets.cert),
            "--kubelet-client-key", str(to_kubelets.key),
            "--kubelet-preferred-address-types", "InternalIP",   # no DNS for node names
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(sa.cert),
            "--service-account-signing-key-file", str(sa.key),
            "--service-cluster-ip-range", "10.96.0.0/24",
            "--authorization-mode", "Node,RBAC", "--disable-admission-plugins", "ServiceAccount",
            "--allow-privileged=true"))     # the node installer's pod, as kubeadm's clusters

        def ready() -> bool:
            for daemon in self.daemons:
                daemon.check_alive()
            return self.kubectl_run("get", "--raw", "/readyz").returncode == 0

        wait_for(ready, timeout=120, interval=0.5, what="kube-apiserver to be ready")

    def _ready(self, node: KubeNode) -> bool:
        if node.proc is not None and node.proc.poll() is not None:
            raise RuntimeError(f"kubelet {node.name} exited:\n{node.log_text()[-3000:]}")
        found = self.kubectl_run("get", "node", node.name, "-o", "json")
        if found.returncode != 0:
            return False
        conditions = json.loads(found.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def publish(self, layout: Path, name: str) -> str:
        """An OCI layout's image into the cluster's registry; its reference."""
        assert self.registry is not None
        ref = f"{self.registry.host}/{name}"
        push_layout(layout, ref, netns=self.cp)
        return ref

    # kubectl ----------------------------------------------------------------------------------

    def kubectl_run(self, *args: str, input: str | None = None,
                    timeout: float = 180) -> subprocess.CompletedProcess[str]:
        cmd = ["nsenter", f"--net={self.cp.path}", str(ecosystem.kube_binary("kubectl")),
               "--kubeconfig", str(self.admin), *args]
        return subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout)

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 180) -> str:
        result = self.kubectl_run(*args, input=input, timeout=timeout)
        if result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout}{result.stderr}")
        return result.stdout

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def pod(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", "pod", name, "-o", "json"))
        return found

    # clean-up ---------------------------------------------------------------------------------

    def stop(self) -> None:
        for proxy in self.proxies:
            stop(proxy.proc)
        for node in reversed(list(self.nodes.values())):
            node.stop()
        for daemon in reversed(self.daemons):     # kube-apiserver before etcd, its clients first
            stop(daemon.proc, timeout=5)
        if self.registry is not None:
            self.registry.stop()
        for netns in reversed(self.namespaces):
            netns.delete()
