"""Content-defined chunks of memory images: speed, and what a next generation stores.

On a file of N MiB (default 256) of random data (memory that does not compress, like model
weights or a random-memory workload), prints:
  - MB/s of cutting (CRC-32 per page), of cutting + sha256 per chunk, of writing a first
    generation (cut, hash, compress, packs), of an unchanged second generation, of a rebuild;
  - the new-bytes fraction of a second generation (new packs + its index, over a full one):
    unchanged; 10% rewritten in one region; 4 KiB pages inserted near the start; 1% of the
    pages rewritten at random places; for several chunk sizes (the default is marked *).
With --criu: the same fraction between two `criu dump --leave-running` of a process this
script starts (a Python process holding --criu-mib MiB of random bytes, idle), CRIU 4.2+.

    python -m bench.chunks [--mib 256] [--criu] [--criu-mib 100]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support import ecosystem
from torpor.image.chunker import DEFAULT_PARAMS, PAGE, ChunkerParams, MappedFile
from torpor.image.packs import REPACK_BELOW, WrittenGeneration, known_chunks, write_generation
from torpor.image.reassemble import packs_in, rebuild

MIB = 1 << 20
KIB = 1 << 10
SIZES = [ChunkerParams(16 * KIB, 64 * KIB, 256 * KIB), ChunkerParams(32 * KIB, 128 * KIB, 512 * KIB),
         ChunkerParams(64 * KIB, 256 * KIB, MIB), ChunkerParams(128 * KIB, 512 * KIB, 2 * MIB)]


def mbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e6:,.0f} MB/s"


def generation(base: Path, label: str, files: dict[str, bytes], params: ChunkerParams,
               previous: WrittenGeneration | None = None) -> WrittenGeneration:
    root = base / label
    root.mkdir()
    for name, data in files.items():
        (root / name).write_bytes(data)
    packs = base / "packs"
    packs.mkdir(exist_ok=True)
    known = known_chunks(previous.index) if previous else None
    return write_generation(str(root), sorted(files), str(packs), known=known, params=params)


def chain(base: Path, data: bytes) -> None:
    """Ten generations, each with 1% of pages rewritten at random places and 5% in one region:
    what each sends, and what a node that holds nothing fetches to restore the last, with and
    without storing again the chunks of packs less than half in use."""
    print("a chain of 10 generations (each: 1% of pages scattered + 5% in one region rewritten);"
          " bytes over the last generation's own compressed chunks:")
    for repack_below in (0.0, REPACK_BELOW):
        work = base / f"chain-{repack_below}"
        (work / "packs").mkdir(parents=True)
        rnd = random.Random(3)
        content = bytearray(data)
        previous: WrittenGeneration | None = None
        sends = []
        for g in range(10):
            if g:
                n = len(content)
                for page in rnd.sample(range(n // PAGE), n // PAGE // 100):
                    content[page * PAGE:(page + 1) * PAGE] = rnd.randbytes(PAGE)
                at = rnd.randrange(0, n - n // 20)
                content[at:at + n // 20] = rnd.randbytes(n // 20)
            root = work / f"g{g}"
            root.mkdir()
            (root / "pages-1.img").write_bytes(content)
            known = known_chunks(previous.index, repack_below) if previous else None
            previous = write_generation(str(root), ["pages-1.img"], str(work / "packs"), known=known)
            sends.append(sent(previous))
            shutil.rmtree(root)
        assert previous is not None
        live = sum(c.length for c in previous.index.chunks)
        fetched = sum(p.size for p in previous.index.packs)
        stored = sum(p.stat().st_size for p in (work / "packs").iterdir())
        print(f"  repack below {repack_below:.0%} in use: generations 2-10 send "
              f"{sum(sends[1:]) / 9 / live:.2f}x on average (at most {max(sends[1:]) / live:.2f}x);"
              f" a fresh restore of generation 10 fetches {fetched / live:.2f}x "
              f"({len(previous.index.packs)} packs); all packs ever written {stored / live:.2f}x")
        shutil.rmtree(work)


def sent(gen: WrittenGeneration) -> int:
    """What a push of this generation sends: its new packs and its index."""
    return gen.stats.new_pack_bytes + len(gen.index.to_json())


def speed(base: Path, data: bytes) -> None:
    path = base / "speed.img"
    path.write_bytes(data)
    with MappedFile(str(path)) as mapped:
        t = time.perf_counter()
        spans = list(mapped.spans())
        cut_s = time.perf_counter() - t
        t = time.perf_counter()
        for span in mapped.spans():
            view = mapped.view(span)
            hashlib.sha256(view).digest()
            view.release()
        hash_s = time.perf_counter() - t
    print(f"cut (CRC-32 per page): {mbps(len(data), cut_s)}; cut + sha256 per chunk: "
          f"{mbps(len(data), hash_s)} ({len(spans)} chunks, "
          f"{len(data) / len(spans) / KIB:.0f} KiB average)")
    g1 = generation(base, "speed-1", {"pages-1.img": data}, DEFAULT_PARAMS)
    g2 = generation(base, "speed-2", {"pages-1.img": data}, DEFAULT_PARAMS, g1)
    out = base / "speed-out"
    out.mkdir()
    t = time.perf_counter()
    rebuild(g2.index, packs_in(str(base / "packs")), str(out))
    rebuild_s = time.perf_counter() - t
    print(f"first generation (cut, hash, compress, write packs): {mbps(len(data), g1.stats.seconds)};"
          f" unchanged second: {mbps(len(data), g2.stats.seconds)}; rebuild (read packs, "
          f"decompress, verify, write): {mbps(len(data), rebuild_s)}  [{os.cpu_count()} cores]")
    shutil.rmtree(base / "packs")


def dedup(base: Path, data: bytes) -> None:
    rnd = random.Random(2)
    n = len(data)
    region = bytearray(data)
    region[n // 3:n // 3 + n // 10] = rnd.randbytes(n // 10)
    inserted = data[:MIB] + rnd.randbytes(4 * PAGE) + data[MIB:]
    scattered = bytearray(data)
    for page in rnd.sample(range(n // PAGE), n // PAGE // 100):
        scattered[page * PAGE:(page + 1) * PAGE] = rnd.randbytes(PAGE)
    cases = {"unchanged": data, "10% rewritten in one region": bytes(region),
             "4 pages (16 KiB) inserted at 1 MiB": inserted,
             "1% of pages rewritten, scattered": bytes(scattered)}
    print(f"new-bytes fraction of a second generation ({n // MIB} MiB random; new packs + index "
          "over a full generation):")
    print(f"  {'chunk sizes min/avg/max':28}" + "".join(f"{c[:34]:>36}" for c in cases)
          + f"{'index/MiB':>11}")
    for params in SIZES:
        work = base / f"dedup-{params.avg_size}"
        work.mkdir()
        g1 = generation(work, "g1", {"pages-1.img": data}, params)
        full = sent(g1)
        row = []
        for i, (_, content) in enumerate(cases.items()):
            g2 = generation(work, f"g2-{i}", {"pages-1.img": content}, params, g1)
            row.append(sent(g2) / full)
        mark = "*" if params == DEFAULT_PARAMS else " "
        label = f"{params.min_size // KIB}K/{params.avg_size // KIB}K/{params.max_size // KIB}K{mark}"
        index_per_mib = len(g1.index.to_json()) / (n / MIB)
        print(f"  {label:28}" + "".join(f"{r:>36.2%}" for r in row) + f"{index_per_mib:>10.0f}B")
        shutil.rmtree(work)


HOLDER = """
import os, sys, time
blob = os.urandom(int(sys.argv[1]) << 20)
heap = [str(i) * 10 for i in range(200000)]
print("ready", flush=True)
while True:
    time.sleep(0.5)
"""


def criu_pair(base: Path, mib: int) -> None:
    criu = ecosystem.which("criu")
    if not criu or os.geteuid() != 0:
        print("criu: skipped (needs root and criu 4.2+)")
        return
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(mib)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        assert holder.stdout is not None
        holder.stdout.readline()
        dirs = []
        for i in (1, 2):
            d = base / f"criu-{i}"
            d.mkdir()
            subprocess.run([criu, "dump", "-t", str(holder.pid), "-D", str(d), "--shell-job",
                            "--leave-running", "-o", "dump.log"], check=True)
            dirs.append(d)
            time.sleep(2)
    finally:
        holder.kill()
        holder.wait()
    names = sorted(p.name for p in dirs[0].iterdir() if p.name.endswith(".img"))
    names2 = sorted(p.name for p in dirs[1].iterdir() if p.name.endswith(".img"))
    pages = sum((dirs[0] / n).stat().st_size for n in names if n.startswith("pages-"))
    zeros = sum(bytes(PAGE) == b for b in _pages(dirs[0] / "pages-1.img"))
    print(f"criu: two dumps, 2 s apart, of an idle Python process holding {mib} MiB of random "
          f"bytes: {len(names)} image files, pages {pages / MIB:.1f} MiB ({zeros} all-zero pages)")
    for params in SIZES:
        packs = base / f"criu-packs-{params.avg_size}"
        packs.mkdir()
        g1 = write_generation(str(dirs[0]), names, str(packs), params=params)
        g2 = write_generation(str(dirs[1]), names2, str(packs), params=params,
                              known=known_chunks(g1.index))
        mark = "*" if params == DEFAULT_PARAMS else " "
        print(f"  {params.min_size // KIB}K/{params.avg_size // KIB}K/{params.max_size // KIB}K"
              f"{mark}: second generation sends {sent(g2) / sent(g1):.2%} of a full one "
              f"({g2.stats.new_chunks} new chunks, {sent(g2) / 1e6:.2f} MB incl. a "
              f"{len(g2.index.to_json()) / 1e3:.0f} kB index); first written at "
              f"{mbps(g1.stats.total_bytes, g1.stats.seconds)}, second at "
              f"{mbps(g2.stats.total_bytes, g2.stats.seconds)}")


def _pages(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return [data[i:i + PAGE] for i in range(0, len(data), PAGE)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--criu", action="store_true")
    parser.add_argument("--criu-mib", type=int, default=100)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="torpor-bench-chunks-", dir="/var/tmp"))
    try:
        rnd = random.Random(1)
        data = b"".join(rnd.randbytes(MIB) for _ in range(args.mib))
        speed(base, data)
        dedup(base, data)
        chain(base, data)
        if args.criu:
            criu_pair(base, args.criu_mib)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
