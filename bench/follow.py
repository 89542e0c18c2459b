"""Pages cut (torpor/image/follow.py) and packed (torpor/image/early_packs.py) while CRIU writes
them: what it costs the dump, and what it saves after.

    python -m bench.follow [--mib 2048] [--rounds 3] [--packed]

A Python process holding --mib MiB of random bytes (memory that does not compress) is dumped
with `criu dump --leave-running` into a directory on the node's disk, twice a round (three times
with --packed), the order rotating: CRIU alone, CRIU with a DumpFollower reading behind it, and
(--packed) CRIU with the follower and an EarlyPacker packing pages images past 2 GiB (no upload:
its cost to the freeze is bench.upload_overlap's). Each dump then becomes a generation as a
checkpoint image makes one (write_generation into packs): the plain dump cut whole, the others
taking what was made during the dump. Prints, as medians: the dump (CRIU's run: what the
workload is frozen for), what follows it (the follower stopped, the generation written), and
the two together, against plain.
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
from torpor.image.early_packs import EarlyPacker
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


Beside = tuple[DumpFollower, EarlyPacker | None] | None


def dump(criu: str, pid: int, directory: Path, way: str) -> tuple[float, Beside]:
    """CRIU's run (the freeze), with the follower (and the packer) started before it."""
    directory.mkdir()
    follower = DumpFollower(str(directory)).start() if way != "plain" else None
    packer = EarlyPacker(follower, f"{directory}-packs", {}, follower.level).start() \
        if follower is not None and way == "packed" else None
    started = time.perf_counter()
    try:
        subprocess.run([criu, "dump", "-t", str(pid), "-D", str(directory), "--shell-job",
                        "--leave-running", "-o", "dump.log"], check=True)
        return time.perf_counter() - started, (follower, packer) if follower else None
    except BaseException:
        if packer is not None:
            packer.stop().abandon()
        if follower is not None:
            follower.stop()
        raise


def generation(directory: Path, beside: Beside) -> tuple[float, WrittenGeneration]:
    """From CRIU's end: the packer and the follower stopped, then the generation written."""
    started = time.perf_counter()
    follower, packer = beside or (None, None)
    packed = packer.stop() if packer is not None else None
    followed = follower.stop() if follower is not None else None
    names = sorted(p.name for p in directory.iterdir() if p.name.endswith(".img"))
    packs = directory.parent / f"{directory.name}-packs"
    packs.mkdir(exist_ok=True)
    try:
        gen = write_generation(str(directory), names, str(packs), followed=followed,
                               early=packed.files if packed is not None else None)
    finally:
        if packed is not None:
            packed.abandon()
    return time.perf_counter() - started, gen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--packed", action="store_true",
                        help="a third way: the follower and an early packer")
    args = parser.parse_args()
    ways = ["plain", "followed", *(["packed"] if args.packed else [])]
    criu = ecosystem.which("criu")
    if not criu or os.geteuid() != 0:
        sys.exit("bench.follow needs root and CRIU 4.2+ (make deps)")
    base = Path(tempfile.mkdtemp(prefix="torpor-bench-follow-"))
    times: dict[str, list[float]] = {f"{k}_{w}": [] for k in ("dump", "gen") for w in ways}
    try:
        with holding(args.mib) as pid:
            for i in range(args.rounds + 1):   # round 0 warms up and is not counted
                for way in ways[i % len(ways):] + ways[:i % len(ways)]:
                    d = base / f"round-{i}-{way}"
                    os.sync()   # the dump pays for no earlier round's writeback
                    dump_s, beside = dump(criu, pid, d, way)
                    gen_s, gen = generation(d, beside)
                    shutil.rmtree(d)
                    shutil.rmtree(f"{d}-packs")
                    print(f"round {i} {way:8}: dump {dump_s:.2f} s, generation {gen_s:.2f} s "
                          f"({gen.stats.followed_bytes >> 20} MiB cut, "
                          f"{gen.stats.early_bytes >> 20} MiB packed of "
                          f"{gen.stats.total_bytes >> 20} MiB during the dump)", flush=True)
                    if i:
                        times[f"dump_{way}"].append(dump_s)
                        times[f"gen_{way}"].append(gen_s)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    m = {k: statistics.median(v) for k, v in times.items()}
    for way in ways[1:]:
        total, total_w = m["dump_plain"] + m["gen_plain"], m[f"dump_{way}"] + m[f"gen_{way}"]
        print(f"{args.mib} MiB, medians of {args.rounds}, {way}: dump {m[f'dump_{way}']:.2f} s "
              f"against {m['dump_plain']:.2f} s plain ({m[f'dump_{way}'] / m['dump_plain']:.2f}x); "
              f"generation after it {m[f'gen_{way}']:.2f} s against {m['gen_plain']:.2f} s "
              f"({m[f'gen_{way}'] / m['gen_plain']:.2f}x); both {total_w:.2f} s against "
              f"{total:.2f} s ({total_w / total:.2f}x)")


if __name__ == "__main__":
    main()
