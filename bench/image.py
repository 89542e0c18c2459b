"""Checkpoint to registry and restore from it, end to end, against bare runc on the same workload.

One container holds N MiB (default 1024) of dirty, incompressible memory (memhog); torpor takes
it from running container to an image in a local docker-registry
(`torpor checkpoint C -t REF --push --leave-running`), and bare runc checkpoints an identical
container to a local directory. Then, the local copy removed, `torpor restore REF` pulls the
image and restores it, against bare `runc restore` from runc's directory. Prints the times,
their ratios, the raw size of runc's checkpoint and the compressed size of torpor's layers. One
warm-up round is thrown away (this VM backs memory on first touch).

    python -m bench.image [--mib 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from bench.checkpoint import bare_bundle, become_subreaper, runc, start
from bench.harness import world
from tests.support.registry import Registry


def du(path: object) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True,
                              check=True).stdout.split()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    become_subreaper()
    with world() as w:
        registry = Registry(w.base, "registry").start()
        try:
            node = w.node("image")
            start(node, "t", args.mib, w.base / "gap-t", ["--runtime", "io.containerd.torpor.v2"])
            start(node, "r", args.mib, w.base / "gap-r", ["--runtime", "io.containerd.runc.v2"])
            torpor_s: list[float] = []
            runc_s: list[float] = []
            pulled_s: list[float] = []
            restored_s: list[float] = []
            compressed = raw = 0
            for i in range(args.rounds + 1):
                ref = f"{registry.host}/bench/t:{i}"
                t = time.perf_counter()
                out = subprocess.run([str(w.bin / "torpor"), "checkpoint", "t", "-t", ref, "--push",
                                      "--leave-running", "--volumes", "none", "--json"],
                                     env=node.env, capture_output=True, text=True, check=True)
                elapsed_t = time.perf_counter() - t
                result = json.loads(out.stdout)
                subprocess.run([str(w.bin / "torpor"), "rm", ref], env=node.env, check=True,
                               capture_output=True)
                ck = w.base / f"runc-{i}"
                elapsed_r = runc(node, "checkpoint", "--leave-running", "--image-path", str(ck),
                                 "--work-path", str(w.base / f"work-{i}"), "r")
                # restore: torpor pulls the image it no longer has; runc reads its directory
                t = time.perf_counter()
                back = subprocess.run([str(w.bin / "torpor"), "restore", ref, "--name", f"t-{i}",
                                       "--volume", "/gap", "--json"], env=node.env,
                                      capture_output=True, text=True, check=True)
                pulled = time.perf_counter() - t
                steps = json.loads(back.stdout).get("timings", {})
                node.ctr("tasks", "delete", "--force", f"t-{i}")
                node.ctr("containers", "rm", f"t-{i}")
                subprocess.run([str(w.bin / "torpor"), "rm", ref], env=node.env,
                               capture_output=True)
                bundle = bare_bundle(node, "r", f"r-{i}", w.base / f"bundle-{i}")
                restored = runc(node, "restore", "--detach", "--image-path", str(ck),
                                "--work-path", str(w.base / f"rwork-{i}"), "--bundle",
                                str(bundle), "--pid-file", str(bundle / "pid"), f"r-{i}")
                pid = int((bundle / "pid").read_text())
                runc(node, "kill", f"r-{i}", "KILL")
                os.waitpid(pid, 0)  # ours: we are the subreaper of what runc restored
                runc(node, "delete", "--force", f"r-{i}")
                if i:
                    torpor_s.append(elapsed_t)
                    runc_s.append(elapsed_r)
                    pulled_s.append(pulled)
                    restored_s.append(restored)
                    compressed, raw = result["compressed_bytes"], du(ck)
                    print(f"round {i}: torpor to registry {elapsed_t:.2f}s (checkpoint "
                          f"{result['timings']['checkpoint_s']:.2f}s, build "
                          f"{result['timings']['build_s']:.2f}s, manifests "
                          f"{result['timings']['push_s']:.2f}s), runc checkpoint "
                          f"{elapsed_r:.2f}s; pull and restore {pulled:.2f}s, runc restore "
                          f"{restored:.2f}s (torpor: pull {steps.get('pull_s', 0):.2f}s, unpack "
                          f"{steps.get('unpack_s', 0):.2f}s, restore {steps.get('restore_s', 0):.2f}s)",
                          flush=True)
                shutil.rmtree(ck, ignore_errors=True)
        finally:
            registry.stop()
    t_med, r_med = statistics.median(torpor_s), statistics.median(runc_s)
    print(f"{args.mib} MiB: checkpoint to registry {t_med:.2f}s, bare runc checkpoint to disk "
          f"{r_med:.2f}s, ratio {t_med / r_med:.2f}")
    p_med, rr_med = statistics.median(pulled_s), statistics.median(restored_s)
    print(f"{args.mib} MiB: restore from the registry (pull + restore) {p_med:.2f}s, bare runc "
          f"restore from disk {rr_med:.2f}s, ratio {p_med / rr_med:.2f}")
    print(f"size: runc's raw images {raw / 2**20:.1f} MiB, torpor's compressed layers "
          f"{compressed / 2**20:.1f} MiB ({compressed / raw:.2f} of raw; memhog's memory is "
          "random, so incompressible)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
