"""`torpor kube migrate` of a pod holding MIB of incompressible memory (default 256) behind a
Service, in the test suite's two-node cluster (tests/support/kube.py: kubelet, kube-apiserver,
etcd, kube-proxy; torpor's node installer on each node), against the baseline a user has
without torpor: the pod deleted and created again on the other node, cold (its memory lost).

A prober on node A asks the Service every 20 ms, each time on a new connection, from before the
migration to its end (connections that arrive while the workload is frozen for its checkpoint
wait in its listen queue: torpor-runc leaves them out of the dump, the original answers them).
Printed per run:
- migrate: the command's wall time, to the moved pod ready and the original deleted; ckpt:
  when kubelet's checkpoint was done;
- state gap: from the checkpoint's start to the moved pod's first answer (what a client that
  stopped writing at the checkpoint waits for the state to answer again);
- service outage: the longest time the Service gave no answer (the original answers until the
  moved pod is ready and the endpoints switch);
- cold: the baseline's time from the delete to the new pod's first answer, state lost.
Each run moves one pod with node A's images encrypted for the nodes' key, as the test cluster's
node A is configured (`[image] encrypt_recipients`; node B's and C's containerd decrypt with
torpor-decoder), and one with that setting taken out, one after the other (`--encryption`).

    python -m bench.kube_migrate [--mib 256] [--runs 1] [--to node-b|node-c]
                                 [--encryption both|on|off]
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import time
import tomllib

import tomlkit

from bench.harness import world
from tests.support import ecosystem, kube_agent
from tests.support.kube import KubeCluster
from tests.support.kube_network import ask
from tests.support.processes import wait_for
from tests.test_kube_cluster import RUNTIME_CLASS, endpoints, pod, service, wait_running

PROBER = """
import socket, sys, time
host, port, until = sys.argv[1], int(sys.argv[2]), time.time() + float(sys.argv[3])
while time.time() < until:
    t = time.time()
    try:
        s = socket.create_connection((host, port), timeout=0.5)
        s.sendall(b"GET k\\n")
        answer = s.makefile().readline().strip()
        s.close()
    except OSError:
        answer = ""
    print(f"{t:.3f} {answer}", flush=True)
    time.sleep(0.02)
"""


def workload(mib: int) -> list[str]:
    return ["sh", "-c", f"memhog {mib} /tmp/gap & kvserver 7000"]


def first_answer(cluster: KubeCluster, pod_ip: str, started: float) -> float:
    node = cluster.nodes["node-a"]
    wait_for(lambda: ask(node.netns, pod_ip, 7000, "GET k", timeout=1) != "", timeout=120,
             interval=0.05, what=f"an answer from {pod_ip}")
    return time.monotonic() - started


def migrate_once(cluster: KubeCluster, run: int, mib: int, target: str) -> dict[str, float]:
    assert cluster.registry is not None
    name = f"big{run}"
    cluster.apply(pod(name, "node-a", cluster.workload_image, "torpor", workload(mib), app=name))
    cluster.apply(service(name))
    original = wait_running(cluster, name)
    node_a = cluster.nodes["node-a"]
    wait_for(lambda: ask(node_a.netns, original["status"]["podIP"], 7000, "SET k v1") == "OK",
             timeout=60, interval=0.2, what="the workload to answer")
    time.sleep(2 + mib / 256)     # memhog fills its memory
    service_ip = cluster.kubectl("get", "service", name, "-o", "jsonpath={.spec.clusterIP}")
    wait_for(lambda: endpoints(cluster, name) != [], timeout=30, interval=0.3,
             what="the Service's endpoints")
    prober = subprocess.Popen(["nsenter", f"--net={node_a.netns.path}", "python3", "-c", PROBER,
                               service_ip, "80", "180"], stdout=subprocess.PIPE, text=True)
    time.sleep(1)
    started = time.monotonic()
    migrate = subprocess.Popen(
        ["nsenter", f"--net={cluster.cp.path}", str(cluster.world.bin / "torpor"), "kube",
         "migrate", name, "--to", target, "--registry", f"{cluster.registry.host}/bench",
         "--kubeconfig", str(cluster.admin), "--kubectl", str(ecosystem.kube_binary("kubectl"))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=node_a.containerd.env)
    assert migrate.stderr is not None and migrate.stdout is not None
    said = list(migrate.stderr)
    out = migrate.stdout.read()
    if migrate.wait() != 0:
        raise SystemExit(f"torpor kube migrate failed:\n{''.join(said)}")
    seconds = time.monotonic() - started
    checkpoint = float(next(line for line in said if "building and pushing" in line)
                       .split("]")[0].strip("[ s"))
    moved_name = out.split(" as ")[1].split()[0]
    moved = cluster.pod(moved_name)
    state_gap = first_answer(cluster, moved["status"]["podIP"], started)
    wait_for(lambda: endpoints(cluster, name) == [moved["status"]["podIP"]], timeout=60,
             interval=0.2, what="the endpoints to switch")
    time.sleep(2)
    prober.kill()
    lines = [line.partition(" ") for line in prober.communicate()[0].split("\n") if line]
    answered = [float(t) for t, _, a in lines if a]
    wrong = {a for _, _, a in lines if a and a != "v1"}
    outage = max((b - a for a, b in itertools.pairwise(answered)), default=float("nan"))
    cold = cold_restart(cluster, moved_name, mib)
    cluster.kubectl("delete", "service", name)
    return {"migrate": seconds, "checkpoint": checkpoint,
            "state_gap": state_gap, "outage": outage, "cold": cold, "wrong": len(wrong)}


def encrypt_on_node_a(cluster: KubeCluster, on: bool) -> None:
    """Node A's [image] encrypt_recipients as the cluster set it, or taken out."""
    path = cluster.nodes["node-a"].containerd.torpor_config
    config = tomllib.loads(path.read_text())
    image = config.setdefault("image", {})
    if on:
        image["encrypt_recipients"] = [f"jwe:{cluster.node_key.with_suffix('.pub')}"]
    else:
        image.pop("encrypt_recipients", None)
    path.write_text(tomlkit.dumps(config))


def cold_restart(cluster: KubeCluster, name: str, mib: int) -> float:
    """The baseline: the pod deleted and created again, plain runc, on the other node."""
    started = time.monotonic()
    cluster.kubectl("delete", "pod", name, "--grace-period=0", "--force")
    cluster.apply(pod(f"{name}-cold", "node-a", cluster.workload_image, None, workload(mib),
                      app=f"{name}-cold"))
    found = wait_running(cluster, f"{name}-cold")
    seconds = first_answer(cluster, found["status"]["podIP"], started)
    cluster.kubectl("delete", "pod", f"{name}-cold", "--wait=false")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--to", default="node-b", choices=("node-b", "node-c"),
                        help="node-b: containerd 2.1, its own CRI restores; node-c: containerd "
                             "2.4, torpor's restore on create")
    parser.add_argument("--encryption", default="both", choices=("both", "on", "off"))
    args = parser.parse_args()
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.encryption]
    if ecosystem.kube_missing():
        raise SystemExit("no Kubernetes binaries: `make deps` builds them")
    with world() as w:
        base = w.base / "kube-cluster"
        base.mkdir()
        cluster = KubeCluster(w, base)
        try:
            cluster.start()
            cluster.kubectl("apply", "-f", str(RUNTIME_CLASS))
            kube_agent.start_agents(cluster)
            print(f"torpor kube migrate of a pod holding {args.mib} MiB, node-a -> {args.to}")
            print(f"{'run':>3} {'enc':>3} {'migrate':>8} {'ckpt':>6} {'state gap':>10} "
                  f"{'outage':>7} {'cold':>6} {'gap/cold':>8}")
            for run, encrypted in itertools.product(range(args.runs), modes):
                encrypt_on_node_a(cluster, encrypted)
                r = migrate_once(cluster, run * 2 + int(not encrypted), args.mib, args.to)
                print(f"{run:>3} {'yes' if encrypted else 'no':>3} {r['migrate']:>7.2f}s "
                      f"{r['checkpoint']:>5.2f}s "
                      f"{r['state_gap']:>9.2f}s {r['outage']:>6.2f}s {r['cold']:>5.2f}s "
                      f"{r['state_gap'] / r['cold']:>7.2f}x"
                      + (f"  ({r['wrong']} wrong answers)" if r["wrong"] else ""))
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()


