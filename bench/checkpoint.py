"""Checkpoint and restore time: torpor against bare runc on the same kind of container.

For each size (default 64 MiB, 256 MiB, 1 GiB of dirty, incompressible memory held by
`memhog`), two identical containers run side by side. One is checkpointed with
`torpor checkpoint --leave-running` (containerd, torpor-runc, network and file capture, CRIU),
the other with bare `runc checkpoint --leave-running` on its runc state. Each is then restored:
`torpor restore --name ...` through containerd, and `runc restore --detach` into a bundle made
from the container's own. Measured, in the same run:

  downtime  the longest stall the workload saw, measured by itself (ticks every millisecond)
  total     the command's wall time, from the user's shell
  restore   the restore command's wall time

    python -m bench.checkpoint [--sizes 64,256,1024] [--rounds 3]
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
from pathlib import Path

from bench.harness import IMAGE, World, world
from tests.support.containerd import Node
from tests.support.processes import wait_for
from tests.support.workload import task_pid


def read_gap_ms(gapfile: Path) -> float:
    return int(gapfile.read_text().strip() or 0) / 1000


def reset_gap(gapfile: Path) -> None:
    gapfile.unlink(missing_ok=True)
    wait_for(lambda: gapfile.exists() and read_gap_ms(gapfile) < 50, timeout=30,
             what="memhog to tick again")


def start(node: Node, name: str, mib: int, gapdir: Path, runtime: list[str],
          gap: bool = True) -> None:
    """memhog holding `mib` MiB, /gap bind-mounted from `gapdir`; with `gap`, its longest stall
    written to /gap/gap every 50 ms (a checkpoint that finds that file open and empty restores
    only while it still is: CRIU checks an open file's size, so `gap=False` where only times
    matter, and the fill is seen in its resident memory)."""
    gapdir.mkdir(parents=True, exist_ok=True)
    node.ctr("run", "-d", *runtime, "--mount", f"type=bind,src={gapdir},dst=/gap,options=rbind:rw",
             IMAGE, name, "memhog", str(mib), *(["/gap/gap"] if gap else []))
    filled = (lambda: (gapdir / "gap").exists()) if gap else (
        lambda: resident_kib(task_pid(node, name)) >= mib * 1024)
    wait_for(filled, timeout=120, what=f"{name} to fill {mib} MiB")


def resident_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def torpor(w: World, node: Node, *args: str) -> float:
    t = time.perf_counter()
    result = subprocess.run([str(w.bin / "torpor"), *args], env=node.env, capture_output=True,
                            text=True)
    elapsed = time.perf_counter() - t
    if result.returncode != 0:
        raise SystemExit(f"torpor {' '.join(args)} failed:\n{result.stderr}")
    return elapsed


def runc(node: Node, *args: str, env: dict[str, str] | None = None) -> float:
    """Bare runc on the node's runc state. Output to a file, never a pipe: a restored process
    inherits runc's stdio, and would hold a pipe open for as long as it lives."""
    with open(node.root / "bare-runc.log", "ab") as log:
        t = time.perf_counter()
        subprocess.run(["runc", "--root", f"/run/containerd/runc/{node.namespace}", *args],
                       check=True, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                       env={**os.environ, **(env or {})})
        return time.perf_counter() - t


def bare_bundle(node: Node, name: str, new: str, out: Path) -> Path:
    """A bundle for `runc restore`: the container's own spec, its rootfs, a new cgroup."""
    bundle = node.root / "state" / "io.containerd.runtime.v2.task" / node.namespace / name
    spec = json.loads((bundle / "config.json").read_text())
    spec["root"]["path"] = str(bundle / "rootfs")
    spec["linux"]["cgroupsPath"] = f"/{node.namespace}/{new}"
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(spec))
    return out


def one_size(w: World, node: Node, mib: int, rounds: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {k: [] for k in (
        "torpor_downtime", "runc_downtime", "torpor_total", "runc_total", "torpor_restore",
        "runc_restore")}
    base = w.base / f"size-{mib}"
    t_name, r_name = f"t{mib}", f"r{mib}"
    start(node, t_name, mib, base / "gap-t", ["--runtime", "io.containerd.torpor.v2"])
    start(node, r_name, mib, base / "gap-r", ["--runtime", "io.containerd.runc.v2"])
    # Round 0 is a warm-up, thrown away: this VM backs memory on first touch, so whoever first
    # writes a GiB into page cache never used before pays several times over.
    for i in range(rounds + 1):
        for who in (("torpor", "runc") if i % 2 else ("runc", "torpor")):
            ck = base / f"{who}-ck-{i}"
            if who == "torpor":
                reset_gap(base / "gap-t" / "gap")
                total = torpor(w, node, "checkpoint", t_name, "-o", str(ck), "--leave-running",
                               "--volumes", "none")
                time.sleep(0.2)
                downtime = read_gap_ms(base / "gap-t" / "gap")
                restore = torpor(w, node, "restore", str(ck), "--name", f"{t_name}-{i}",
                                 "--volume", "/gap")  # its bind mount, granted as it is
                node.ctr("tasks", "delete", "--force", f"{t_name}-{i}")
                node.ctr("containers", "rm", f"{t_name}-{i}")
            else:
                reset_gap(base / "gap-r" / "gap")
                total = runc(node, "checkpoint", "--leave-running", "--image-path", str(ck),
                             "--work-path", str(base / f"work-{i}"), r_name)
                time.sleep(0.2)
                downtime = read_gap_ms(base / "gap-r" / "gap")
                bundle = bare_bundle(node, r_name, f"{r_name}-{i}", base / f"bundle-{i}")
                restore = runc(node, "restore", "--detach", "--image-path", str(ck),
                               "--work-path", str(base / f"rwork-{i}"), "--bundle", str(bundle),
                               "--pid-file", str(bundle / "pid"), f"{r_name}-{i}")
                pid = int((bundle / "pid").read_text())
                runc(node, "kill", f"{r_name}-{i}", "KILL")
                os.waitpid(pid, 0)  # ours: we are the subreaper of what runc restored
                runc(node, "delete", "--force", f"{r_name}-{i}")
            if i > 0:
                results[f"{who}_downtime"].append(downtime)
                results[f"{who}_total"].append(total * 1000)
                results[f"{who}_restore"].append(restore * 1000)
            shutil.rmtree(ck, ignore_errors=True)
    for name in (t_name, r_name):
        node.ctr("tasks", "delete", "--force", name)
        node.ctr("containers", "rm", name)
    shutil.rmtree(base, ignore_errors=True)
    return results


def become_subreaper() -> None:
    """Processes `runc restore --detach` leaves behind become our children, for us to reap."""
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256,1024", help="MiB of dirty memory, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    become_subreaper()
    rows = []
    with world() as w:
        node = w.node("ckpt")
        for mib in (int(s) for s in args.sizes.split(",")):
            r = {k: statistics.median(v) for k, v in one_size(w, node, mib, args.rounds).items()}
            rows.append((mib, r))
            print(f"{mib:5d} MiB  downtime torpor {r['torpor_downtime']:7.0f} ms  runc "
                  f"{r['runc_downtime']:7.0f} ms  ratio {r['torpor_downtime'] / r['runc_downtime']:.2f}"
                  f" | total torpor {r['torpor_total']:7.0f} ms  runc {r['runc_total']:7.0f} ms  "
                  f"ratio {r['torpor_total'] / r['runc_total']:.2f}"
                  f" | restore torpor {r['torpor_restore']:7.0f} ms  runc "
                  f"{r['runc_restore']:7.0f} ms  ratio {r['torpor_restore'] / r['runc_restore']:.2f}",
                  flush=True)
    os.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
