"""Pages cut while CRIU writes them (torpor/image/follow.py): what it costs the dump, and what it
saves after.

    python -m bench.follow [--mib 2048] [--rounds 3]

A Python process holding --mib MiB of random bytes (memory that does not compress) is dumped
with `criu dump --leave-running` into a directory on the node's disk, twice a round, the order
alternating: CRIU alone, and CRIU with a DumpFollower reading behind it. Each dump then becomes a
generation as a checkpoint image makes one (write_generation into packs): the plain dump cut
whole, the followed one taking what the follower made. Prints, as medians: the dump (CRIU's
run: what the workload is frozen for), what follows it (the follower stopped, the generation
written), and the two together, followed over plain.
Needs root and CRIU 4.2+ (`make deps`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support import ecosystem
from torpor.image.follow import DumpFollower
from torpor.image.packs import WrittenGeneration, write_generation

HOLDER = """
import random, sys, time
r, n = random.Random(7), int(sys.argv[1]) << 20
blob = bytearray(n)
for i in range(0, n, 64 << 20):   # randbytes takes at most 2**31 bits at once
    blob[i:i + (64 << 20)] = r.randbytes(min(64 << 20, n - i))
print("ready", flush=True)
while True:
    time.sleep(0.5)
"""


@contextlib.contextmanager
def holding(mib: int) -> Iterator[int]:
    """A Python process of ours holding `mib` MiB of random bytes, ready to be dumped: its pid.
    Killed by that pid at the end."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(mib)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert holder.stdout is not None
        if holder.stdout.readline() != b"ready\n":
            sys.exit("the process to dump did not start")
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def dump(criu: str, pid: int, directory: Path, follow: bool) -> tuple[float, DumpFollower | None]:
    """CRIU's run (the freeze), with the follower started before it if `follow`."""
    directory.mkdir()
    follower = DumpFollower(str(directory)).start() if follow else None
    started = time.perf_counter()
    try:
        subprocess.run([criu, "dump", "-t", str(pid), "-D", str(directory), "--shell-job",
                        "--leave-running", "-o", "dump.log"], check=True)
        return time.perf_counter() - started, follower
    except BaseException:
        if follower is not None:
            follower.stop()
        raise


def generation(directory: Path, follower: DumpFollower | None) -> tuple[float, WrittenGeneration]:
    """From CRIU's end: the follower stopped, then the generation written."""
    started = time.perf_counter()
    followed = follower.stop() if follower is not None else None
    names = sorted(p.name for p in directory.iterdir() if p.name.endswith(".img"))
    packs = directory.parent / f"{directory.name}-packs"
    packs.mkdir()
    gen = write_generation(str(directory), names, str(packs), followed=followed)
    return time.perf_counter() - started, gen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    criu = ecosystem.which("criu")
    if not criu or os.geteuid() != 0:
        sys.exit("bench.follow needs root and CRIU 4.2+ (make deps)")
    base = Path(tempfile.mkdtemp(prefix="torpor-bench-follow-"))
    times: dict[str, list[float]] = {k: [] for k in ("dump", "dump_f", "gen", "gen_f")}
    try:
        with holding(args.mib) as pid:
            for i in range(args.rounds + 1):   # round 0 warms up and is not counted
                order = (False, True) if i % 2 else (True, False)
                for follow in order:
                    d = base / f"round-{i}-{'followed' if follow else 'plain'}"
                    os.sync()   # the dump pays for no earlier round's writeback
                    dump_s, follower = dump(criu, pid, d, follow)
                    gen_s, gen = generation(d, follower)
                    shutil.rmtree(d)
                    shutil.rmtree(f"{d}-packs")
                    cut = gen.stats.followed_bytes >> 20
                    print(f"round {i} {'followed' if follow else 'plain   '}: dump {dump_s:.2f} s, "
                          f"generation {gen_s:.2f} s ({cut} MiB of {gen.stats.total_bytes >> 20} "
                          f"MiB cut during the dump)", flush=True)
                    if i:
                        times["dump_f" if follow else "dump"].append(dump_s)
                        times["gen_f" if follow else "gen"].append(gen_s)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    m = {k: statistics.median(v) for k, v in times.items()}
    total, total_f = m["dump"] + m["gen"], m["dump_f"] + m["gen_f"]
    print(f"{args.mib} MiB, medians of {args.rounds}: dump {m['dump_f']:.2f} s followed against "
          f"{m['dump']:.2f} s ({m['dump_f'] / m['dump']:.2f}x); generation after it "
          f"{m['gen_f']:.2f} s against {m['gen']:.2f} s ({m['gen_f'] / m['gen']:.2f}x); "
          f"both {total_f:.2f} s against {total:.2f} s ({total_f / total:.2f}x)")


if __name__ == "__main__":
    main()
