"""Soak: many checkpoint/restore cycles of one workload, and what they leave behind.

One workload lives through every cycle, as a chain of generations: each cycle checkpoints
the container that the previous cycle restored (stopping it) and restores it under a new name,
then removes the stopped one; odd cycles go through a checkpoint directory (removed after the
restore), even ones through one image in the local store, replaced each time. After two warm-up
cycles the leftovers are counted, and again at the end:

  fds          open file descriptors of containerd, and of the workload's shim; shims
  mounts       mount points under the world's directory (containerd's root and state)
  netns        network namespaces held by containerd, its shims and their containers
  containerd   leases, content blobs, snapshots, images
  torpor       journals, container locks, record directories, scratch directories
  disk         bytes under containerd's root, torpor's state dir, torpor's image store, and
               containerd's extracted checkpoints (XDG_RUNTIME_DIR), each apart

The goal is no growth at all. The counter must come back every cycle: a workload lost is a
failure, whatever the leaks.

    python -m bench.soak [--cycles 100]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import IMAGE, World, world
from tests.support.containerd import Node
from tests.support.processes import pids_with_arg
from tests.support.workload import COUNTER, read_counter, wait_counter_above

REF = "localhost/soak/counter:1"


def torpor(w: World, node: Node, *args: str) -> None:
    result = subprocess.run([str(w.bin / "torpor"), *args], env=node.env, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise SystemExit(f"torpor {' '.join(args)} failed:\n{result.stderr}")


def fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def descendants(roots: list[int]) -> list[int]:
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, todo = set(roots), list(roots)
    while todo:
        pid = todo.pop()
        for child, ppid in parent.items():
            if ppid == pid and child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found)


def net_namespaces(pids: list[int]) -> int:
    """Network namespaces held by these processes (the node: containerd, shims, containers)."""
    seen = set()
    for pid in pids:
        try:
            seen.add(os.readlink(f"/proc/{pid}/ns/net"))
        except OSError:
            continue
    return len(seen)


def mounts_under(path: Path) -> int:
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        return sum(1 for line in f if line.split()[4].startswith(prefix))


def disk(*paths: Path) -> int:
    total = 0
    for path in paths:
        for root, _, files in os.walk(path):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    continue
    return total


def count(node: Node, what: str) -> int:
    if what == "snapshots":  # no -q: one header line, then one line per snapshot
        return len(node.ctr(what, "ls").stdout.splitlines()[1:])
    return len(node.ctr(what, "ls", "-q").stdout.split())


def shim_pid(node: Node, name: str) -> int:
    """The shim serving `name`: a containerd-shim whose argv names this daemon's socket."""
    task_pid = next((int(line.split()[1]) for line in node.ctr("tasks", "ls").stdout.splitlines()[1:]
                     if line.split()[0] == name), 0)
    try:
        with open(f"/proc/{task_pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def snapshot(w: World, node: Node, name: str, state_dir: Path, store: Path) -> dict[str, int]:
    assert node.proc is not None
    shims = [p for p in pids_with_arg(node.address) if p != node.proc.pid]
    checkpoints = state_dir / "checkpoints"
    return {
        "containerd fds": fds(node.proc.pid),
        "shim fds (workload)": fds(shim_pid(node, name)),
        "shims": len(shims),
        "mounts": mounts_under(w.base),
        "network namespaces": net_namespaces(descendants([node.proc.pid, *shims])),
        "containerd leases": count(node, "leases"),
        "containerd content": count(node, "content"),
        "containerd snapshots": count(node, "snapshots"),
        "containerd images": count(node, "images"),
        "torpor journals": len([p for p in checkpoints.glob("*") if p.name != "locks"])
        + len(list((store / "journals").glob("*"))),
        "torpor locks": len(list((checkpoints / "locks").glob("*"))),
        "torpor records": len(list((state_dir / "containers").glob("*/*"))),
        "torpor scratch": len(list((store / "scratch").glob("*"))),
        "disk: containerd root": disk(node.root / "root"),
        "disk: torpor state": disk(state_dir),
        "disk: torpor store": disk(store),
        "disk: extracted ckpts": disk(node.root / "xdg"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=100)
    args = parser.parse_args()
    with world() as w:
        state_dir, store = w.base / "soak-state", w.base / "soak-store"
        config = w.base / "soak.toml"
        config.write_text(f'[runtime]\nstate_dir = "{state_dir}"\n'
                          f'log_dir = "{state_dir}-logs"\n[image]\nstore = "{store}"\n')
        node = w.node("soak", config=config)
        baseline: dict[str, int] = {}
        started = time.monotonic()
        lost = 0
        current = "soak-0"
        node.ctr("run", "-d", "--runtime", "io.containerd.torpor.v2", IMAGE, current, "sh",
                 "-c", COUNTER)
        wait_counter_above(node, current, 3, timeout=30)
        for cycle in range(1, args.cycles + 1):
            new = f"soak-{cycle}"
            before = read_counter(node, current)
            if cycle % 2:
                ck = w.base / "soak-ck"
                torpor(w, node, "checkpoint", current, "-o", str(ck))
                torpor(w, node, "restore", str(ck), "--name", new)
                shutil.rmtree(ck)
            else:
                torpor(w, node, "checkpoint", current, "-t", REF)
                torpor(w, node, "restore", REF, "--name", new)
            if read_counter(node, new) < before:
                lost += 1
            wait_counter_above(node, new, read_counter(node, new))
            node.ctr("tasks", "delete", "--force", current)
            node.ctr("containers", "delete", current)
            current = new
            if cycle == 2:
                baseline = snapshot(w, node, current, state_dir, store)
            if cycle == args.cycles:
                final = snapshot(w, node, current, state_dir, store)
            if cycle % 10 == 0:
                print(f"cycle {cycle:4d}  {time.monotonic() - started:6.0f}s  counter "
                      f"{read_counter(node, current)}", flush=True)
        print(f"\n{args.cycles} cycles in {time.monotonic() - started:.0f}s; workloads lost: "
              f"{lost}")
        print(f"{'':24s} {'after cycle 2':>14s} {'at the end':>14s} {'leaked':>10s}")
        for key, value in final.items():
            print(f"{key:24s} {baseline.get(key, 0):14d} {value:14d} "
                  f"{value - baseline.get(key, 0):10d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
