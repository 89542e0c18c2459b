"""Checkpoint and restore CPU of memory that does not compress: torpor's chunks against plain
copying, and against torpor before raw chunks (every chunk a zstd frame, every frame read back
through zstd).

On a file of N MiB (default 512) of random bytes (--kind skewed: bytes that zstd shrinks by
only ~5%), in --dir (default /dev/shm: memory, so that
the disk's writeback does not swamp the CPU figures), each in its own process, in turn (rotated each round),
`--rounds` times:
  - copy:     read the file and write it again (the floor a checkpoint and a restore pay);
  - torpor:   write_generation (cut, sha256, encode, packs) then rebuild (read, check, write);
  - before:   the same with the torpor of `--before DIR` (a tree holding an older torpor/,
              e.g. `git archive 2cd3fc4 torpor | tar -x -C /tmp/before`).
Prints wall and CPU seconds (user + system) of each step and the ratios.

    python -m bench.raw_chunks [--mib 512] [--rounds 5] [--dir /dev/shm] [--before /tmp/before]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 1 << 20

STEP = r"""
import json, os, resource, shutil, sys, time
mode, src, work = sys.argv[1:4]

def clock():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime + r.ru_stime

def copy(a, b):
    with open(a, "rb") as i, open(b, "wb") as o:
        shutil.copyfileobj(i, o, 1 << 20)

os.makedirs(work + "/packs"); os.makedirs(work + "/out")
if mode == "copy":
    t0, c0 = clock(); copy(src + "/pages-1.img", work + "/packs/copy")
    t1, c1 = clock(); copy(work + "/packs/copy", work + "/out/pages-1.img")
else:
    from torpor.image.packs import write_generation
    from torpor.image.reassemble import packs_in, rebuild
    t0, c0 = clock(); g = write_generation(src, ["pages-1.img"], work + "/packs")
    t1, c1 = clock(); rebuild(g.index, packs_in(work + "/packs"), work + "/out")
t2, c2 = clock()
stored = sum(os.path.getsize(os.path.join(work, "packs", p)) for p in os.listdir(work + "/packs"))
print(json.dumps({"checkpoint": [t1 - t0, c1 - c0], "restore": [t2 - t1, c2 - c1],
                  "stored": stored}))
"""


def run(mode: str, pythonpath: str, src: Path, work: Path) -> dict[str, list[float]]:
    shutil.rmtree(work, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": pythonpath}
    out = subprocess.run([sys.executable, "-c", STEP, mode, str(src), str(work)], env=env,
                         check=True, capture_output=True, text=True).stdout
    shutil.rmtree(work, ignore_errors=True)
    result: dict[str, list[float]] = json.loads(out)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default="/dev/shm")
    parser.add_argument("--before", help="a directory holding an older torpor/ package")
    parser.add_argument("--kind", choices=("random", "skewed"), default="random",
                        help="random: uniform bytes (zstd's own raw-block bail-out applies); "
                             "skewed: bytes from 200 of the 256 values, ~1.05x with zstd")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    modes = {"copy": here, "torpor": here}
    if args.before:
        modes["before"] = args.before
    base = Path(tempfile.mkdtemp(prefix="torpor-bench-raw-", dir=args.dir))
    try:
        src = base / "src"
        src.mkdir()
        with open(src / "pages-1.img", "wb") as f:
            table = bytes(range(200)) + bytes(range(56))  # 56 values twice as likely
            for _ in range(args.mib):
                block = os.urandom(MIB)
                f.write(block if args.kind == "random" else block.translate(table))
        results: dict[str, list[dict[str, list[float]]]] = {m: [] for m in modes}
        order = list(modes)
        for r in range(args.rounds):  # each round in another order: none always goes first
            for mode in order[r % len(order):] + order[:r % len(order)]:
                results[mode].append(run(mode, modes[mode], src, base / "work"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{args.mib} MiB of {args.kind} bytes in {args.dir}, {args.rounds} rounds rotated, median "
          f"[{os.cpu_count()} cores]; wall s / CPU s (user+system):")
    median: dict[str, dict[str, tuple[float, float]]] = {}
    for mode, rounds in results.items():
        median[mode] = {}
        for step in ("checkpoint", "restore"):
            walls = sorted(r[step][0] for r in rounds)
            cpus = sorted(r[step][1] for r in rounds)
            median[mode][step] = (walls[len(walls) // 2], cpus[len(cpus) // 2])
        stored = rounds[0]["stored"]
        print(f"  {mode:8} checkpoint {median[mode]['checkpoint'][0]:.2f} / "
              f"{median[mode]['checkpoint'][1]:.2f}   restore {median[mode]['restore'][0]:.2f} / "
              f"{median[mode]['restore'][1]:.2f}   stored {stored / (args.mib * MIB):.4f} of the file")
    for other in [m for m in ("before", "copy") if m in median]:
        ratios = [median["torpor"][step][i] / median[other][step][i]
                  for step in ("checkpoint", "restore") for i in (0, 1)]
        print(f"  torpor over {other}: checkpoint {ratios[0]:.2f}x wall, {ratios[1]:.2f}x CPU; "
              f"restore {ratios[2]:.2f}x wall, {ratios[3]:.2f}x CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
