"""Generations of checkpoint images through a registry: what a next checkpoint sends, how long
it takes against the first, how close `torpor estimate` comes, and what periodic checkpoints
cost a CPU-bound workload.

Part 1 (each round a fresh container and repository): a container holds N MiB (default 256) of
random memory (`memhog`, idle); `torpor checkpoint C -t REF --push --leave-running` three times
into a local docker-registry: the first (full), the second with nothing changed, the third
after the workload rewrote 10% of its memory in one region. Before each, `torpor estimate C`.
Prints per round and as medians:
  - the new-bytes fraction: bytes the push sent (HEAD first: blobs the registry holds are not
    sent) over the first's;
  - the time of each incremental checkpoint over the first's (wall time of the command);
  - each estimate over what the checkpoint really stored (the first: all its blobs; the next:
    the blobs new to the registry).

Part 2 (--cost): two identical CPU-bound containers (`memhog M -c FILE`, M MiB of memory) run
side by side, for a window alone, then for a window with one of them under `torpor checkpoint
C -t REF --every E --leave-running` (local store), `--windows` pairs. Background load hits both
alike, so the cost is read from the checkpointed one's throughput against its twin's (under
checkpoints, against alone). Also prints the checkpoint call's time per round (the freeze is
inside it) and torpor's own CPU time per round (CLI, containerd, shim, torpor-runc, CRIU), as
fractions of the interval.

    python -m bench.generations [--mib 256] [--rounds 3]
    python -m bench.generations --cost [--cost-mib 64] [--every 60] [--window 180] [--windows 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.checkpoint import become_subreaper
from bench.harness import IMAGE, World, world
from tests.support.containerd import Node
from tests.support.processes import pids_with_arg, wait_for
from tests.support.registry import Registry

SHIM = ["--runtime", "io.containerd.torpor.v2"]


def torpor_json(w: World, node: Node, *args: str) -> tuple[dict[str, Any], float]:
    t = time.perf_counter()
    out = subprocess.run([str(w.bin / "torpor"), *args, "--json"], env=node.env,
                         capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"torpor {' '.join(args)} failed:\n{out.stderr}")
    return json.loads(out.stdout), elapsed


def exec_text(node: Node, name: str, command: str) -> str:
    return node.ctr("tasks", "exec", "--exec-id", f"b{time.monotonic_ns()}", name, "sh", "-c",
                    command, check=False).stdout


def one_round(w: World, node: Node, registry: Registry, mib: int, n: int) -> dict[str, float]:
    name = f"gen{n}"
    node.ctr("run", "-d", *SHIM, IMAGE, name, "memhog", str(mib), "-s", "/tmp/rewrites")
    try:
        wait_for(lambda: "memhog" in exec_text(node, name, "ps"), timeout=60, what="memhog")
        time.sleep(max(1.0, mib / 256))  # filled
        refs = [f"{registry.host}/bench/{name}:{i}" for i in (1, 2, 3)]
        rows: list[tuple[dict[str, Any], dict[str, Any], float]] = []
        for i, ref in enumerate(refs):
            if i == 2:
                node.ctr("tasks", "kill", "--signal", "SIGUSR2", name)
                wait_for(lambda: "rewrites 1" in exec_text(node, name, "cat /tmp/rewrites"),
                         timeout=60, what="the rewrite")
            estimate, _ = torpor_json(w, node, "estimate", name)
            result, seconds = torpor_json(w, node, "checkpoint", name, "-t", ref, "--push",
                                          "--leave-running", "--volumes", "none")
            rows.append((estimate, result, seconds))
        inspected = [torpor_json(w, node, "inspect", ref)[0]["generation"] for ref in refs]
    finally:
        node.ctr("tasks", "delete", "--force", name, check=False)
        node.ctr("containers", "delete", name, check=False)
    sent = [r["pushed"]["bytes_uploaded"] for _, r, _ in rows]
    times = [s for _, _, s in rows]
    figures = {
        "first_sent_mb": sent[0] / 1e6, "first_s": times[0],
        "unchanged_sent": sent[1] / sent[0], "unchanged_time": times[1] / times[0],
        "region_sent": sent[2] / sent[0], "region_time": times[2] / times[0],
        "estimate_full": rows[0][0]["full_bytes"] / inspected[0]["stored_bytes"],
        "estimate_unchanged_new": rows[1][0]["new_bytes"] / max(1, inspected[1]["new_bytes"]),
        "estimate_region_new": rows[2][0]["new_bytes"] / inspected[2]["new_bytes"],
        "estimate_s": rows[0][0]["seconds"],
    }
    print(f"round {n}: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items()), flush=True)
    return figures


def generations(w: World, mib: int, rounds: int) -> None:
    registry = Registry(w.base, "registry").start()
    try:
        node = w.node("generations")
        results = [one_round(w, node, registry, mib, n) for n in range(rounds + 1)][1:]
    finally:
        registry.stop()
    print(f"\n{mib} MiB of random memory, {rounds} rounds (after a warm-up), medians:")
    for key in results[0]:
        print(f"  {key:24s} {statistics.median(r[key] for r in results):.4f}")


def work_done(node: Node, name: str) -> int:
    text = exec_text(node, name, "cat /tmp/work").split()
    return int(text[0]) if text else 0


def node_cpu_s(node: Node) -> float:
    """CPU seconds of the node's containerd and shims, with the children they reaped
    (torpor-runc, runc, CRIU, torpor-hook): what checkpoints cost besides the CLI."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in {*pids_with_arg(node.address), *([node.proc.pid] if node.proc else [])}:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / tick


def stall(node: Node, name: str) -> int:
    """The workload's longest stall so far, in microseconds (memhog -c's third field)."""
    text = exec_text(node, name, "cat /tmp/work").split()
    return int(text[2]) if len(text) > 2 else 0


def rates(node: Node, names: list[str], seconds: float) -> list[float]:
    """Each workload's rounds per second over the same `seconds`."""
    start = [work_done(node, n) for n in names]
    t = time.monotonic()
    time.sleep(seconds)
    end = [work_done(node, n) for n in names]
    elapsed = time.monotonic() - t
    return [(e - s) / elapsed for s, e in zip(start, end, strict=True)]


def cost(w: World, mib: int, every: int, seconds: int, windows: int) -> None:
    """Two identical CPU-bound containers run side by side; only `cpu-a` is checkpointed, in
    the second window of each pair. Background load hits both alike, so the cost is read from
    the ratio a/b under checkpoints against a/b alone; torpor's own CPU time is counted too."""
    node = w.node("cost")
    names = ["cpu-a", "cpu-b"]
    for name in names:
        node.ctr("run", "-d", *SHIM, IMAGE, name, "memhog", str(mib), "-c", "/tmp/work")
    try:
        wait_for(lambda: all(work_done(node, n) > 0 for n in names), timeout=60,
                 what="both workloads")
        time.sleep(2)
        alone: list[float] = []
        under: list[float] = []
        cpu: list[float] = []
        rounds: list[dict[str, Any]] = []
        for i in range(windows):
            a, b = rates(node, names, seconds)
            alone.append(a / b)
            before = node_cpu_s(node)
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            series = subprocess.Popen(
                [str(w.bin / "torpor"), "checkpoint", "cpu-a", "-t",
                 f"localhost/bench/cpu-{i}", "--every", f"{every}s", "--keep", "2",
                 "--leave-running", "--json"],
                env=node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                assert series.stdout is not None
                series.stdout.readline()  # the first round (and the CLI's start) is not steady
                a2, b2 = rates(node, names, seconds)
            finally:
                series.send_signal(signal.SIGTERM)
                out, err = series.communicate(timeout=300)
            usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the CLI (and 2 ctr execs)
            cli = usage.ru_utime + usage.ru_stime - children.ru_utime - children.ru_stime
            cpu.append(cli + node_cpu_s(node) - before)
            under.append(a2 / b2)
            done = [json.loads(line) for line in out.splitlines() if line.strip()]  # 2nd on
            rounds += [d for d in done if not d["error"]]
            print(f"window {i}: a/b alone {alone[-1]:.4f} (a {a:.0f}/s), under --every {every}s "
                  f"{under[-1]:.4f} (a {a2:.0f}/s); {len(done) + 1} checkpoints, "
                  f"{sum(1 for d in done if d['error'])} failed, exit {series.returncode}; "
                  f"torpor's CPU {cpu[-1]:.1f}s", flush=True)
            if series.returncode:
                print(err, file=sys.stderr)
        stalls = [stall(node, name) for name in names]
    finally:
        for name in names:
            node.ctr("tasks", "delete", "--force", name, check=False)
            node.ctr("containers", "delete", name, check=False)
    ratio = statistics.median(under) / statistics.median(alone)
    calls = [r["result"]["timings"].get("checkpoint_s", 0.0) for r in rounds]
    per_round = sum(cpu) / max(1, len(rounds))
    print(f"\nCPU-bound workloads ({mib} MiB), windows of {seconds}s, --every {every}s:")
    print(f"  throughput under checkpoints against the twin left alone: {ratio:.4f} "
          f"(cost {1 - ratio:.2%})")
    print(f"  the checkpoint call (containerd, torpor-runc, CRIU; the freeze is inside it) per "
          f"round: median {statistics.median(calls):.2f}s; the workload's longest stall in "
          f"the whole run: {stalls[0] / 1e6:.2f}s (its twin's {stalls[1] / 1e6:.2f}s)")
    print(f"  torpor's CPU per round (CLI, containerd, shim, torpor-runc, CRIU): "
          f"{per_round:.2f}s = {per_round / every:.2%} of one core")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cost", action="store_true", help="part 2 only")
    parser.add_argument("--cost-mib", type=int, default=64)
    parser.add_argument("--every", type=int, default=60)
    parser.add_argument("--window", type=int, default=180)
    parser.add_argument("--windows", type=int, default=2)
    args = parser.parse_args()
    become_subreaper()
    with world() as w:
        if args.cost:
            cost(w, args.cost_mib, args.every, args.window, args.windows)
        else:
            generations(w, args.mib, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
