"""What a durable commit costs: the fsyncs torpor makes before CRIU may stop a container.

For checkpoints of N MiB (default 64 and 512) laid out like a real one (a large pages image,
forty small CRIU images, a read-write layer and checkpoint.json), freshly written (dirty in the
page cache) each time, prints the seconds of:
  - write: writing the files (no sync), for scale;
  - fsync, one by one: every file, then every directory, sequentially;
  - sync_tree: torpor.durable.sync_tree (every file and directory, 8 at once) - what torpor uses;
  - syncfs: syncfs(2) of the whole filesystem (also writes out whatever else is dirty on it).

With --real: real checkpoints (`torpor checkpoint NAME -o DIR`, which stops the container) of a
`memhog` container holding N MiB of dirty memory on a test node; prints the seconds of the
post-dump sync of CRIU's images (sync_dump_s), of the sync before the commit (sync_s) and the
checkpoint's total.

    python -m bench.durability [--mib 64,512] [--dir DIR] [--rounds 2] [--real]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from torpor import durable

MIB = 1 << 20


def write_checkpoint(root: str, mib: int) -> None:
    criu = os.path.join(root, "criu")
    os.makedirs(criu)
    chunk = os.urandom(MIB)
    small = max(1, mib // 64)
    with open(os.path.join(criu, "pages-1.img"), "wb") as f:
        for _ in range(mib - small):
            f.write(chunk)
    for i in range(40):
        with open(os.path.join(criu, f"core-{i}.img"), "wb") as f:
            f.write(chunk[: 1024 * (1 + i % 16)])
    with open(os.path.join(root, "rootfs-diff.tar"), "wb") as f:
        for _ in range(small):
            f.write(chunk)
    with open(os.path.join(root, "checkpoint.json"), "wb") as f:
        f.write(b"{}" * 2048)


def one_by_one(root: str) -> None:
    directories = []
    for directory, _, names in os.walk(root):
        directories.append(directory)
        for name in names:
            durable.sync_file(os.path.join(directory, name))
    for directory in directories:
        durable.sync_dir(directory)
    durable.sync_dir(os.path.dirname(root))


def measure(base: str, mib: int, method: str) -> tuple[float, float]:
    root = tempfile.mkdtemp(prefix="ck-", dir=base)
    try:
        os.sync()  # nothing else dirty: each method pays for its own files only
        t = time.monotonic()
        write_checkpoint(root, mib)
        written = time.monotonic() - t
        t = time.monotonic()
        if method == "fsync, one by one":
            one_by_one(root)
        elif method == "sync_tree":
            durable.sync_tree(root)
        elif method == "syncfs":
            durable.syncfs(root)
        return written, time.monotonic() - t
    finally:
        shutil.rmtree(root, ignore_errors=True)


def real(mibs: list[int], rounds: int) -> None:
    import json
    import subprocess
    from pathlib import Path

    from bench.checkpoint import start
    from bench.harness import world

    with world() as w:
        node = w.node("durable")
        for mib in mibs:
            for i in range(rounds):
                name = f"d{mib}-{i}"
                base = w.base / name
                start(node, name, mib, base / "gap", ["--runtime", "io.containerd.torpor.v2"])
                ck = Path(tempfile.mkdtemp(prefix="ck-", dir=os.environ.get("TMPDIR", "/var/tmp")))
                ck.rmdir()
                try:
                    out = subprocess.run([str(w.bin / "torpor"), "checkpoint", name, "-o", str(ck),
                                          "--volumes", "none", "--json"], env=node.env,
                                         capture_output=True, text=True, check=True).stdout
                    timings = json.loads(out)["timings"]
                    state = json.loads((ck / "criu" / "torpor-state.json").read_text())
                    size = sum(f.stat().st_size for f in ck.rglob("*") if f.is_file()) / MIB
                    print(f"{mib:5d} MiB  real checkpoint ({size:5.0f} MiB on disk): sync at post-dump "
                          f"{state['timings'].get('sync_dump_s', 0):5.2f} s, before the commit "
                          f"{timings.get('sync_s', 0):5.2f} s, total {timings['total_s']:5.2f} s")
                finally:
                    shutil.rmtree(ck, ignore_errors=True)
                    node.ctr("tasks", "delete", "--force", name, check=False)
                    node.ctr("containers", "rm", name, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", default="64,512")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--real", action="store_true")
    args = parser.parse_args()
    if args.real:
        real([int(m) for m in args.mib.split(",")], args.rounds)
        return
    base = args.dir or tempfile.mkdtemp(prefix="torpor-bench-durability-")
    print(f"in {base}")
    for mib in (int(m) for m in args.mib.split(",")):
        for method in ("fsync, one by one", "sync_tree", "syncfs"):
            runs = [measure(base, mib, method) for _ in range(args.rounds)]
            write_s = min(r[0] for r in runs)
            sync_s = min(r[1] for r in runs)
            print(f"{mib:5d} MiB  {method:18s} sync {sync_s:6.2f} s "
                  f"({mib / sync_s if sync_s else 0:6.0f} MiB/s)   write {write_s:5.2f} s")
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
