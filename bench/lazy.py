"""Restore straight from a registry: torpor whole, torpor lazy, and bare runc from a local dir.

    python -m bench.lazy [--sizes 256,2048] [--rounds 2] [--from-store]

For each size, a container holding that much incompressible memory (memhog) is checkpointed on
node a (`torpor checkpoint -t REF --push --leave-running`) and, as the baseline, a same-sized
one under plain runc by bare `runc checkpoint --leave-running` to a local directory. Node b (its
own image store, emptied before each restore, page cache dropped before each step) then
restores, rounds alternating the order:
  torpor       `torpor restore REF`         (download, verify, rebuild, then CRIU)
  torpor lazy  `torpor restore REF --lazy`  (CRIU without the memory; pages after, ranges)
  runc         `runc restore --detach` from the local directory (no network, no checks)
  serve        every layer of the image sent by the registry to /dev/null over PARALLEL
               connections: what any restore from this registry must wait for at least
With --from-store, node a restores instead of node b: the image is in its store (the checkpoint
put it there), so nothing comes from the registry and `serve` is left out: a restore again on
the node that holds the image.
"answers": from the command's start until the restored memhog writes its tick file again (it
ticks every millisecond, writing every 50 ticks: its own loop runs, touching a few pages);
"complete": until the command returns (for lazy, the last page placed). Medians; ratios are
torpor / runc.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.checkpoint import bare_bundle, become_subreaper, runc
from bench.harness import IMAGE, World, world
from tests.support.containerd import Node
from tests.support.processes import wait_for
from tests.support.registry import Registry
from tests.support.workload import task_status

PARALLEL = 4   # connections for `serve`: RegistryOptions.parallel, what torpor pulls with
STEPS = {"torpor": ("pull_s", "unpack_s", "restore_s"),     # torpor restore --json timings
         "lazy": ("pull_s", "restore_s", "lazy_s", "keep_s")}


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def start(node: Node, name: str, mib: int, gapdir: Path, runtime: str) -> None:
    gapdir.mkdir(parents=True, exist_ok=True)
    node.ctr("run", "-d", "--runtime", runtime, "--mount",
             f"type=bind,src={gapdir},dst=/gap,options=rbind:rw", IMAGE, name, "sh", "-c",
             f"exec memhog {mib} /gap/gap -x {mib}")
    wait_for(lambda: (gapdir / "gap").exists(), timeout=300, what=f"{name} to fill {mib} MiB")


def timed(cmd: list[str], env: dict[str, str] | None, gap: Path,
          stdout: Path | None = None) -> tuple[float, float]:
    """(answers, complete) in seconds: the tick file back, the command done; its standard
    output into `stdout` when given."""
    gap.unlink(missing_ok=True)
    t = time.perf_counter()
    log = open(gap.parent.parent / "bench.log", "ab")  # a file: restored processes inherit it
    out = open(stdout, "wb") if stdout is not None else log
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=log)
    answered = 0.0
    while True:
        if not answered and gap.exists():
            answered = time.perf_counter() - t
        if proc.poll() is not None and (answered or time.perf_counter() - t > 600):
            break
        time.sleep(0.002)
    done = time.perf_counter() - t
    log.close()
    out.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): see {log.name}")
    if not answered:
        wait_for(gap.exists, timeout=60, what="the restored memhog to tick")
        answered = time.perf_counter() - t
    return answered, done


def serve(registry: Registry, repository: str, tag: str) -> float:
    """Seconds for the registry to send every layer of the image, PARALLEL at a time."""
    def drain(digest: str) -> None:
        with urllib.request.urlopen(f"http://{registry.host}/v2/{repository}/blobs/{digest}",
                                    timeout=60) as answer:
            while answer.read(1 << 20):
                pass

    t = time.perf_counter()
    with ThreadPoolExecutor(PARALLEL) as pool:
        list(pool.map(drain, sorted(registry.layer_digests(repository, tag))))
    return time.perf_counter() - t


def one_size(w: World, a: Node, b: Node, registry: Registry, mib: int,
             rounds: int, from_store: bool = False) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    base = w.base / f"lazy-{mib}"
    gap_a, gap_r = base / "gap-t", base / "gap-r"
    start(a, f"t{mib}", mib, gap_a, "io.containerd.torpor.v2")
    start(a, f"r{mib}", mib, gap_r, "io.containerd.runc.v2")
    ref = f"{registry.host}/bench/lazy{mib}:1"
    subprocess.run([str(w.bin / "torpor"), "checkpoint", f"t{mib}", "-t", ref, "--push",
                    "--leave-running", "--volumes", "none"], env=a.env, check=True,
                   capture_output=True)
    ck = base / "runc-ck"
    runc(a, "checkpoint", "--leave-running", "--image-path", str(ck), "--work-path",
         str(base / "work"), f"r{mib}")
    originals = (f"t{mib}", f"r{mib}")
    for name in originals:   # only the restored ones tick from now on
        a.ctr("tasks", "kill", "-s", "KILL", name)
    wait_for(lambda: all(task_status(a, n) == "STOPPED" for n in originals),
             what="the checkpointed containers to stop")
    node = a if from_store else b
    order = ["torpor", "lazy", "runc"] + ([] if from_store else ["serve"])
    for i in range(rounds):
        for who in order[i % len(order):] + order[:i % len(order)]:
            name = f"{who}{mib}-{i}"
            drop_caches()
            if who == "serve":
                answered = done = serve(registry, f"bench/lazy{mib}", "1")
            elif who == "runc":
                bundle = bare_bundle(a, f"r{mib}", name, base / f"bundle-{i}")
                answered, done = timed(
                    ["runc", "--root", f"/run/containerd/runc/{a.namespace}", "restore",
                     "--detach", "--image-path", str(ck), "--work-path", str(base / f"rw-{i}"),
                     "--bundle", str(bundle), "--pid-file", str(bundle / "pid"), name],
                    None, gap_r / "gap")
                pid = int((bundle / "pid").read_text())
                runc(a, "kill", name, "KILL")
                os.waitpid(pid, 0)
                runc(a, "delete", "--force", name)
            else:
                extra = ["--lazy"] if who == "lazy" else []
                report = base / f"{name}.json"
                answered, done = timed([str(w.bin / "torpor"), "restore", ref, "--name", name,
                                        "--volume", "/gap", "--json", *extra], node.env,
                                       gap_a / "gap", report)
                timings = json.loads(report.read_text()).get("timings", {})
                for step in STEPS[who]:
                    out.setdefault(f"{who}_{step}", []).append(float(timings.get(step, 0.0)))
                if who == "lazy":   # where the pages came from: ranges, the packs' download
                    for key in ("lazy_remote_bytes", "lazy_streamed_bytes"):
                        out.setdefault(key, []).append(float(timings.get(key, 0)) / (1 << 20))
                node.ctr("tasks", "delete", "--force", name)
                node.ctr("containers", "rm", name)
                if not from_store:   # the next restore downloads again
                    subprocess.run([str(w.bin / "torpor"), "rm", ref], env=b.env,
                                   capture_output=True)
            out.setdefault(f"{who}_answers", []).append(answered)
            out.setdefault(f"{who}_complete", []).append(done)
    for name in (f"t{mib}", f"r{mib}"):
        a.ctr("tasks", "delete", "--force", name)
        a.ctr("containers", "rm", name)
    shutil.rmtree(base, ignore_errors=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,2048", help="MiB of memory, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--from-store", action="store_true",
                        help="restore on the node whose store holds the image, not from the registry")
    args = parser.parse_args()
    become_subreaper()
    with world() as w:
        registry = Registry(w.base, "registry").start()
        try:
            a = w.node("lazy-a")
            config = w.base / "node-b.toml"
            config.write_text(w.config.read_text().replace(str(w.store), str(w.base / "store-b")))
            b = w.node("lazy-b", config=config)
            for mib in (int(s) for s in args.sizes.split(",")):
                r = {k: statistics.median(v) for k, v in
                     one_size(w, a, b, registry, mib, args.rounds, args.from_store).items()}
                print(f"{mib:5d} MiB | answers: torpor {r['torpor_answers']:6.2f} s "
                      f"({r['torpor_answers'] / r['runc_answers']:.2f}x)  lazy "
                      f"{r['lazy_answers']:6.2f} s ({r['lazy_answers'] / r['runc_answers']:.2f}x)"
                      f"  runc {r['runc_answers']:6.2f} s | complete: torpor "
                      f"{r['torpor_complete']:6.2f} s ({r['torpor_complete'] / r['runc_complete']:.2f}x)"
                      f"  lazy {r['lazy_complete']:6.2f} s "
                      f"({r['lazy_complete'] / r['runc_complete']:.2f}x)  runc "
                      f"{r['runc_complete']:6.2f} s", flush=True)
                if not args.from_store:
                    print(f"          the registry alone sends the image in "
                          f"{r['serve_complete']:.2f} s ({r['serve_complete'] / r['runc_complete']:.2f}x "
                          f"runc): the floor of any restore from it", flush=True)
                for who, steps in STEPS.items():
                    print(f"          {who}: " + ", ".join(
                        f"{step[:-2]} {r[f'{who}_{step}']:.2f} s" for step in steps), flush=True)
                print(f"          lazy pages: {r['lazy_remote_bytes']:.0f} MiB by range, "
                      f"{r['lazy_streamed_bytes']:.0f} MiB from the packs' download", flush=True)
        finally:
            registry.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
