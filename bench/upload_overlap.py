"""What an upload that starts while CRIU dumps could save, and what it would cost the freeze.

    python -m bench.upload_overlap [--mib 2048] [--rounds 3]

A checkpoint to a registry uploads its packs after CRIU's dump (ops/checkpoint.py): the packs'
boundaries follow the size of each pages image, which is known only once CRIU has written it
(image/packs.py PackSizing). This measures the most that starting the upload with the dump
could save here, before building it: the registry's ingest of the same bytes as CRIU's images
(bench/image.py's raw blobs, PARALLEL connections) after the dump, against the same ingest
started with it, with every byte to send already at hand (an upper bound: a real one could send
only what CRIU has written). During the dump the upload runs either at nice 10, its threads and
the registry's (so CRIU keeps its CPU, as the follower does, image/follow.py), or not niced.

A Python process holding --mib MiB of random bytes is dumped with `criu dump --leave-running`
into a directory on the node's disk, three ways a round, the order rotating; the blobs sent are
an earlier dump's pages (in the page cache), each round to a repository of its own. Prints, as
medians: the dump (what the workload is frozen for) and the time until dump and upload are both
done, each way against the upload after the dump. A warm-up round is not counted.
Needs root, CRIU 4.2+ and docker-registry (`make deps`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.follow import dump, holding
from bench.image import PARALLEL, Part, raw_parts, upload_part
from tests.support import ecosystem
from tests.support.registry import Registry

NICE = 10
WAYS = ("after", "during, nice 10", "during")


def renice(pid: int, level: int) -> None:
    """Every thread of `pid` (a process this benchmark started) to nice `level`."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), level)
        except OSError:   # a thread that has just ended
            pass


def ingest(host: str, repository: str, parts: list[Part], nice: int) -> None:
    def send(part: Part) -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        upload_part(host, repository, part)
    with ThreadPoolExecutor(PARALLEL) as pool:
        list(pool.map(send, parts))


def one_way(way: str, criu: str, pid: int, directory: Path, registry: Registry,
            repository: str, parts: list[Part]) -> tuple[float, float]:
    """(the dump, until dump and upload are both done)."""
    assert registry.proc is not None
    os.sync()
    started = time.perf_counter()
    if way == "after":
        dump_s, _ = dump(criu, pid, directory, "plain")
        ingest(registry.host, repository, parts, 0)
        return dump_s, time.perf_counter() - started
    nice = NICE if "nice" in way else 0
    renice(registry.proc.pid, nice)
    failed: list[BaseException] = []

    def upload() -> None:
        try:
            ingest(registry.host, repository, parts, nice)
        except BaseException as e:
            failed.append(e)
    sender = threading.Thread(target=upload)
    sender.start()
    try:
        dump_s, _ = dump(criu, pid, directory, "plain")
    finally:
        renice(registry.proc.pid, 0)
        sender.join()
    if failed:
        raise failed[0]
    return dump_s, time.perf_counter() - started


def run_ways(rounds: int, criu: str, pid: int, base: Path, registry: Registry,
             times: dict[str, list[tuple[float, float]]]) -> None:
    """Every way, `rounds` rounds and a warm-up, the order rotating; into `times`."""
    dump(criu, pid, base / "sent", "plain")
    parts = [p for p in raw_parts(base / "sent") if p[0].name.startswith("pages-")]
    n = 0
    for i in range(rounds + 1):   # round 0 warms up and is not counted
        for way in WAYS[i % 3:] + WAYS[:i % 3]:
            n += 1
            directory = base / f"dump-{n}"
            dump_s, total_s = one_way(way, criu, pid, directory, registry,
                                      f"bench/overlap{n}", parts)
            shutil.rmtree(directory)
            print(f"round {i} upload {way:<15}: dump {dump_s:.2f} s, dump and upload "
                  f"{total_s:.2f} s", flush=True)
            if i:
                times[way].append((dump_s, total_s))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    criu = ecosystem.which("criu")
    if not criu or os.geteuid() != 0 or not shutil.which("docker-registry"):
        sys.exit("bench.upload_overlap needs root, CRIU 4.2+ and docker-registry (make deps)")
    base = Path(tempfile.mkdtemp(prefix="torpor-bench-overlap-"))
    registry = Registry(base / "registries", "overlap").start()
    times: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    try:
        with holding(args.mib) as pid:
            run_ways(args.rounds, criu, pid, base, registry, times)
    finally:
        registry.stop()
        shutil.rmtree(base, ignore_errors=True)
    m = {way: (statistics.median(d for d, _ in v), statistics.median(t for _, t in v))
         for way, v in times.items()}
    dump_a, total_a = m["after"]
    print(f"{args.mib} MiB, medians of {args.rounds}: upload after the dump: dump {dump_a:.2f} s, "
          f"both {total_a:.2f} s")
    for way in WAYS[1:]:
        dump_w, total_w = m[way]
        print(f"  upload {way}: dump {dump_w:.2f} s ({dump_w / dump_a:.2f}x), both "
              f"{total_w:.2f} s ({total_w / total_a:.2f}x)")


if __name__ == "__main__":
    main()
