"""Checkpoint straight to a registry: torpor against Podman's `podman container checkpoint
--create-image` and `podman push`, on the same workload, registry and machine, in the same run.

For each size, one container holds that much dirty memory (memhog) under torpor (containerd,
torpor-runc) and an identical one under Podman (runc, its own storage in a temporary directory,
cgroupfs, no network: nothing of the host's Podman is touched). Each round times, from the
shell, `torpor checkpoint C -t REF --push --leave-running` against `podman container checkpoint
--leave-running --create-image REF C` followed by `podman push REF`, both into the same local
docker-registry. Round 0 is a warm-up, thrown away; medians.

    python -m bench.podman [--sizes 64,512] [--rounds 3]

Podman is not one of torpor's runtime dependencies; `make deps` installs it for the tests
(tests/test_podman.py) and this benchmark, which without it says so and exits 2.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.checkpoint import become_subreaper, start
from bench.harness import world
from tests.support.processes import wait_for
from tests.support.registry import Registry


def podman_command(root: Path) -> list[str]:
    return ["podman", "--root", str(root / "root"), "--runroot", str(root / "run"),
            "--tmpdir", str(root / "tmp"), "--cgroup-manager", "cgroupfs",
            "--events-backend", "file", "--runtime", shutil.which("runc") or "runc"]


def host_limits() -> list[str]:
    """This machine's own limits: Podman's defaults (nofile 1048576...) may exceed them."""
    out = []
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = resource.getrlimit(which)
        out += ["--ulimit", f"{name}={min(soft, 4096)}:{min(hard, 4096)}"]
    return out


def must(argv: list[str], env: dict[str, str] | None = None) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{result.stderr}")
    return result.stdout


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    must(argv, env)
    return time.perf_counter() - t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,512", help="MiB of dirty memory, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("podman") is None:
        print("podman is not installed (Debian: apt-get install podman)", file=sys.stderr)
        return 2
    become_subreaper()
    # a path that makes a valid image name: Podman names what it pulls from an OCI layout after it
    tmp = Path(f"/var/tmp/torpor-bench-podman-{os.getpid()}")
    with world() as w:
        registry = Registry(w.base, "registry").start()
        podman = podman_command(tmp)
        try:
            node = w.node("podman")
            shutil.copytree(w.image_layout, tmp / "busybox")
            must([*podman, "pull", "-q", f"oci:{tmp / 'busybox'}"])
            image = must([*podman, "images", "-q"]).split()[0]
            for mib in (int(s) for s in args.sizes.split(",")):
                gap_p = w.base / f"gap-p-{mib}"
                gap_p.mkdir()
                start(node, f"t{mib}", mib, w.base / f"gap-t-{mib}",
                      ["--runtime", "io.containerd.torpor.v2"])
                must([*podman, "run", "-d", "--network", "none", *host_limits(),
                      "--name", f"p{mib}",
                      "-v", f"{gap_p}:/gap", image, "memhog", str(mib), "/gap/gap"])
                wait_for(lambda g=gap_p: (g / "gap").exists(), timeout=120,  # type: ignore[misc]
                         what=f"podman's memhog to fill {mib} MiB")
                torpor_s: list[float] = []
                podman_s: list[float] = []
                for i in range(args.rounds + 1):
                    ref_t = f"{registry.host}/bench/t{mib}:{i}"
                    ref_p = f"{registry.host}/bench/p{mib}:{i}"
                    elapsed_t = timed([str(w.bin / "torpor"), "checkpoint", f"t{mib}", "-t",
                                       ref_t, "--push", "--leave-running", "--volumes", "none"],
                                      env=node.env)
                    subprocess.run([str(w.bin / "torpor"), "rm", ref_t], env=node.env,
                                   capture_output=True)
                    t = time.perf_counter()
                    timed([*podman, "container", "checkpoint", "--leave-running",
                           "--create-image", ref_p, f"p{mib}"])
                    timed([*podman, "push", "--tls-verify=false", ref_p])
                    elapsed_p = time.perf_counter() - t
                    subprocess.run([*podman, "rmi", ref_p], capture_output=True)
                    if i:
                        torpor_s.append(elapsed_t)
                        podman_s.append(elapsed_p)
                        print(f"  {mib} MiB round {i}: torpor {elapsed_t:.2f}s, podman "
                              f"{elapsed_p:.2f}s", flush=True)
                t_med, p_med = statistics.median(torpor_s), statistics.median(podman_s)
                print(f"{mib:5d} MiB  checkpoint to registry: torpor {t_med:.2f}s, podman "
                      f"checkpoint --create-image + push {p_med:.2f}s, ratio {t_med / p_med:.2f}",
                      flush=True)
                node.ctr("tasks", "delete", "--force", f"t{mib}")
                node.ctr("containers", "rm", f"t{mib}")
                subprocess.run([*podman, "rm", "-f", f"p{mib}"], capture_output=True)
        finally:
            subprocess.run([*podman, "rm", "-a", "-f"], capture_output=True)
            subprocess.run([*podman, "rmi", "-a", "-f"], capture_output=True)
            registry.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
