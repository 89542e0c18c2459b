"""Checkpoint to registry and restore from it, end to end, against bare runc on the same workload.

One container holds N MiB (default 1024) of dirty, incompressible memory (memhog); torpor takes
it from running container to an image in a local docker-registry
(`torpor checkpoint C -t REF --push --leave-running`), and bare runc checkpoints an identical
container to a local directory. Each round pushes to a repository of its own, so every blob is
uploaded (a repository holding the previous round's packs would be sent nothing: the memory is
unchanged and packs converge). The registry's own ingest of runc's raw images is timed too
(plain HTTP uploads of the same bytes in PART-sized blobs over PARALLEL connections, their
digests computed beforehand): no client can push those bytes to this registry faster, so
`runc dump + ingest` is the floor for checkpointing to it. Then, the local copy removed,
`torpor restore REF` pulls the image and restores it, against bare `runc restore` from runc's
directory; which restore goes first alternates by round. Each timed step starts after a
sync, so that none pays for the previous one's writeback. Prints the times, their ratios, the
raw size of runc's checkpoint and the compressed size of torpor's layers. One warm-up round is
thrown away (this VM backs memory on first touch).

    python -m bench.image [--mib 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.checkpoint import bare_bundle, become_subreaper, runc, start
from bench.harness import World, world
from tests.support.containerd import Node
from tests.support.registry import Registry

PART = 512 << 20   # bytes per blob of the raw upload
PARALLEL = 4       # connections, as torpor's own push (RegistryOptions.parallel)


def du(path: object) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True,
                              check=True).stdout.split()[0])


Part = tuple[Path, int, int, str]   # file, offset, length, sha256 digest


def raw_parts(directory: Path) -> list[Part]:
    """runc's checkpoint files as blobs of at most PART bytes, each with its digest (untimed)."""
    parts = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        size = path.stat().st_size
        for offset in range(0, size, PART):
            length = min(PART, size - offset)
            h = hashlib.sha256()
            for block in blocks(path, offset, length, 8 << 20):
                h.update(block)
            parts.append((path, offset, length, "sha256:" + h.hexdigest()))
    return parts


def blocks(path: Path, offset: int, length: int, size: int) -> Iterator[bytes]:
    """`length` bytes of `path` from `offset`, read `size` at a time."""
    with open(path, "rb") as f:
        f.seek(offset)
        while length:
            block = f.read(min(length, size))
            if not block:
                raise RuntimeError(f"{path} ends before {offset}+{length}")
            yield block
            length -= len(block)


def upload_part(host: str, repository: str, part: Part) -> None:
    """One blob by POST and a streamed PUT ?digest=, as a minimal client would."""
    path, offset, length, digest = part
    conn = http.client.HTTPConnection(host, timeout=300)
    try:
        conn.request("POST", f"/v2/{repository}/blobs/uploads/")
        answer = conn.getresponse()
        answer.read()
        location = urllib.parse.urlsplit(answer.headers["Location"])
        query = f"{location.query}&" if location.query else ""
        conn.putrequest("PUT", f"{location.path}?{query}digest={digest}")
        conn.putheader("Content-Type", "application/octet-stream")
        conn.putheader("Content-Length", str(length))
        conn.endheaders()
        for block in blocks(path, offset, length, 1 << 20):
            conn.send(block)
        answer = conn.getresponse()
        answer.read()
        if answer.status != 201:
            raise RuntimeError(f"the registry answered {answer.status} to {path}+{offset}")
    finally:
        conn.close()


def ingest(host: str, repository: str, parts: list[Part]) -> float:
    """Seconds for the registry to take `parts`, PARALLEL at a time."""
    t = time.perf_counter()
    with ThreadPoolExecutor(PARALLEL) as pool:
        list(pool.map(lambda part: upload_part(host, repository, part), parts))
    return time.perf_counter() - t


def torpor_restore(w: World, node: Node, ref: str, name: str) -> tuple[float, dict[str, float]]:
    """`torpor restore REF` of an image not in the store: seconds, and its own timings."""
    t = time.perf_counter()
    back = subprocess.run([str(w.bin / "torpor"), "restore", ref, "--name", name, "--volume",
                           "/gap", "--json"], env=node.env, capture_output=True, text=True,
                          check=True)
    pulled = time.perf_counter() - t
    node.ctr("tasks", "delete", "--force", name)
    node.ctr("containers", "rm", name)
    subprocess.run([str(w.bin / "torpor"), "rm", ref], env=node.env, capture_output=True)
    return pulled, json.loads(back.stdout).get("timings", {})


def runc_restore(w: World, node: Node, ck: Path, i: int) -> float:
    """Bare `runc restore` from runc's directory `ck`: seconds."""
    bundle = bare_bundle(node, "r", f"r-{i}", w.base / f"bundle-{i}")
    restored = runc(node, "restore", "--detach", "--image-path", str(ck), "--work-path",
                    str(w.base / f"rwork-{i}"), "--bundle", str(bundle), "--pid-file",
                    str(bundle / "pid"), f"r-{i}")
    pid = int((bundle / "pid").read_text())
    runc(node, "kill", f"r-{i}", "KILL")
    os.waitpid(pid, 0)  # ours: we are the subreaper of what runc restored
    runc(node, "delete", "--force", f"r-{i}")
    return restored


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    become_subreaper()
    with world() as w:
        registry = Registry(w.base, "registry").start()
        try:
            node = w.node("image")
            start(node, "t", args.mib, w.base / "gap-t", ["--runtime", "io.containerd.torpor.v2"])
            start(node, "r", args.mib, w.base / "gap-r", ["--runtime", "io.containerd.runc.v2"])
            torpor_s: list[float] = []
            runc_s: list[float] = []
            ingest_s: list[float] = []
            pulled_s: list[float] = []
            restored_s: list[float] = []
            compressed = raw = 0
            for i in range(args.rounds + 1):
                ref = f"{registry.host}/bench/t{i}:{i}"   # a new repository: every blob goes up
                os.sync()   # each timed step starts with nothing left to write back
                t = time.perf_counter()
                out = subprocess.run([str(w.bin / "torpor"), "checkpoint", "t", "-t", ref, "--push",
                                      "--leave-running", "--volumes", "none", "--json"],
                                     env=node.env, capture_output=True, text=True, check=True)
                elapsed_t = time.perf_counter() - t
                result = json.loads(out.stdout)
                subprocess.run([str(w.bin / "torpor"), "rm", ref], env=node.env, check=True,
                               capture_output=True)
                ck = w.base / f"runc-{i}"
                os.sync()
                elapsed_r = runc(node, "checkpoint", "--leave-running", "--image-path", str(ck),
                                 "--work-path", str(w.base / f"work-{i}"), "r")
                parts = raw_parts(ck)
                os.sync()
                ingested = ingest(registry.host, f"bench/raw{i}", parts)
                # restore: torpor pulls the image it no longer has; runc reads its directory;
                # who goes first alternates (memory one frees, the next backs faster here)
                for who in ("torpor", "runc") if i % 2 else ("runc", "torpor"):
                    os.sync()   # each timed step starts with nothing left to write back
                    if who == "torpor":
                        pulled, steps = torpor_restore(w, node, ref, f"t-{i}")
                    else:
                        restored = runc_restore(w, node, ck, i)
                if i:
                    torpor_s.append(elapsed_t)
                    runc_s.append(elapsed_r)
                    ingest_s.append(ingested)
                    pulled_s.append(pulled)
                    restored_s.append(restored)
                    compressed, raw = result["compressed_bytes"], du(ck)
                    sent = result["pushed"]["bytes_uploaded"] / 2**20
                    print(f"round {i}: torpor to registry {elapsed_t:.2f}s (checkpoint "
                          f"{result['timings']['checkpoint_s']:.2f}s of which the dump "
                          f"{result['timings'].get('dump_s', 0):.2f}s, build and upload "
                          f"{result['timings']['build_s']:.2f}s, manifests "
                          f"{result['timings']['push_s']:.2f}s; {sent:.0f} MiB sent, "
                          f"{result.get('followed_bytes', 0) / 2**20:.0f} MiB cut and "
                          f"{result.get('early_packed_bytes', 0) / 2**20:.0f} MiB packed and "
                          f"sent during the dump), runc "
                          f"checkpoint {elapsed_r:.2f}s, the registry taking runc's images "
                          f"{ingested:.2f}s; pull and restore {pulled:.2f}s, runc restore "
                          f"{restored:.2f}s (torpor: pull {steps.get('pull_s', 0):.2f}s, unpack "
                          f"{steps.get('unpack_s', 0):.2f}s, restore {steps.get('restore_s', 0):.2f}s)",
                          flush=True)
                shutil.rmtree(ck, ignore_errors=True)
                # no later round reads this one's repositories: without this the registry's
                # storage grows by twice the memory a round, crowding this VM's page cache
                shutil.rmtree(registry.storage / "docker", ignore_errors=True)
        finally:
            registry.stop()
    t_med, r_med = statistics.median(torpor_s), statistics.median(runc_s)
    i_med = statistics.median(ingest_s)
    print(f"{args.mib} MiB: checkpoint to registry {t_med:.2f}s, bare runc checkpoint to disk "
          f"{r_med:.2f}s, ratio {t_med / r_med:.2f}")
    print(f"{args.mib} MiB: the registry taking runc's raw images alone ({PARALLEL} connections) "
          f"{i_med:.2f}s, {i_med / r_med:.2f}x the dump; torpor against runc's dump plus that "
          f"upload {t_med / (r_med + i_med):.2f}")
    p_med, rr_med = statistics.median(pulled_s), statistics.median(restored_s)
    print(f"{args.mib} MiB: restore from the registry (pull + restore) {p_med:.2f}s, bare runc "
          f"restore from disk {rr_med:.2f}s, ratio {p_med / rr_med:.2f}")
    print(f"size: runc's raw images {raw / 2**20:.1f} MiB, torpor's compressed layers "
          f"{compressed / 2**20:.1f} MiB ({compressed / raw:.2f} of raw; memhog's memory is "
          "random, so incompressible)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
