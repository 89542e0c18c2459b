"""`torpor restore REF` from a registry whose bandwidth is the bound, against the same restore
in two steps (`torpor pull REF`, then `torpor restore REF` from the node's store): the one-pass
restore rebuilds CRIU's images beside the download (ops/streamed_pull.py), the two-step one
after it. The registry is reached through a proxy that answers at most RATE MiB/s
(tests/support/tcp_proxy.py); the container holds MIB of memhog's incompressible memory, the
local copy is removed before each restore, the two orders alternate, medians after a warm-up.

    python -m bench.streamed_restore [--mib 256] [--rate 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

from bench.checkpoint import become_subreaper, start
from bench.harness import World, world
from tests.support.containerd import Node
from tests.support.registry import Registry
from tests.support.tcp_proxy import ThrottledProxy


def torpor(w: World, node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(w.bin / "torpor"), *args], capture_output=True, text=True,
                          env={**node.env, "TORPOR_NO_SERVICE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"torpor {' '.join(args)} failed:\n{done.stderr}")
    return done


def one(w: World, node: Node, registry: Registry, rate: int, name: str,
        two_steps: bool) -> tuple[float, float]:
    """(seconds until the restore returned, seconds of it spent unpacking after the pull)."""
    proxy = ThrottledProxy(int(registry.host.rsplit(":", 1)[1]), rate << 20)
    ref = f"{proxy.host}/bench/t:1"
    try:
        started = time.perf_counter()
        if two_steps:
            torpor(w, node, "pull", ref)
        done = torpor(w, node, "restore", ref, "--name", name, "--volume", "/gap", "--json")
        seconds = time.perf_counter() - started
    finally:
        proxy.close()
    node.ctr("tasks", "delete", "--force", name)
    node.ctr("containers", "rm", name)
    torpor(w, node, "rm", ref)
    return seconds, float(json.loads(done.stdout)["timings"].get("unpack_s", 0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rate", type=int, default=64, help="the registry's MiB/s")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    become_subreaper()
    with world() as w:
        node = w.node("stream")
        registry = Registry(w.base / "registries", "stream").start()
        try:
            start(node, "t", args.mib, w.base / "stream" / "gap-t",
                  ["--runtime", "io.containerd.torpor.v2"], gap=False)
            torpor(w, node, "checkpoint", "t", "-t", f"{registry.host}/bench/t:1", "--push",
                   "--leave-running")
            torpor(w, node, "rm", f"{registry.host}/bench/t:1")
            found: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for i in range(args.rounds + 1):
                for two_steps in (False, True) if i % 2 else (True, False):
                    measured = one(w, node, registry, args.rate, f"r{i}{int(two_steps)}",
                                   two_steps)
                    if i > 0:
                        found[two_steps].append(measured)
            node.ctr("tasks", "delete", "--force", "t")
            node.ctr("containers", "rm", "t")
        finally:
            registry.stop()
    one_pass = statistics.median(s for s, _ in found[False])
    two = statistics.median(s for s, _ in found[True])
    print(f"{args.mib} MiB through {args.rate} MiB/s: restore REF {one_pass:.2f} s (unpacking "
          f"after the download {statistics.median(u for _, u in found[False]):.2f} s) | pull, "
          f"then restore {two:.2f} s (unpacking {statistics.median(u for _, u in found[True]):.2f}"
          f" s) | one pass / two steps {one_pass / two:.2f}")


if __name__ == "__main__":
    main()
