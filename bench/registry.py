"""Registry push and pull throughput: torpor's client against skopeo, same layout, same registry.

    python -m bench.registry [--layers-mib 96,96,64,64] [--rounds 5]

One OCI layout shaped like a checkpoint (an index of a runnable image and a state artifact whose
layers are incompressible random data) is pushed and pulled by both tools, against the same
private docker-registry on 127.0.0.1:
  push  torpor `push_layout(layout, ref)`      vs  `skopeo copy --all oci:LAYOUT:TAG docker://REF`
  pull  torpor `pull(ref, dir)`                vs  `skopeo copy --all docker://REF oci:DIR:TAG`
        (torpor's default leaves pulled blobs to the page cache, digest-checked on every read;
        "pull+fsync" is torpor with RegistryOptions(fsync_blobs=True), durable like skopeo)
Both run as whole processes (interpreter start included), each to its own repository. Each round
starts a fresh registry (empty storage, a new port: skopeo's blob-info cache cannot mount blobs
from an earlier round) and alternates which tool goes first; `sync` runs before each timed step.
MB/s = MiB of layout blobs / wall seconds; medians over the rounds.

Each pulled copy is deleted (untimed) before the next step. On a VM whose host backs guest memory
on first touch, writing into page cache that was never used before is several times slower than
into pages freed earlier; without the deletes the later steps of a run would measure that.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.checkpoint_layouts import WrittenLayout, write_checkpoint_layout
from tests.support.registry import Registry

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
TORPOR_PUSH = "import sys; from torpor.registry import push_layout; push_layout(sys.argv[1], sys.argv[2])"
TORPOR_PULL = "import sys; from torpor.registry import pull; pull(sys.argv[1], sys.argv[2])"
TORPOR_PULL_FSYNC = ("import sys; from torpor.registry import RegistryOptions, pull; "
                     "pull(sys.argv[1], sys.argv[2], options=RegistryOptions(fsync_blobs=True))")


def timed(command: list[str]) -> float:
    os.sync()  # no step pays for the previous one's dirty pages
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr}")
    return elapsed


def one_round(base: Path, layout: WrittenLayout, round_no: int) -> dict[str, float]:
    registry = Registry(base, f"registry-{round_no}").start()
    try:
        host = registry.host
        torpor_ref = f"{host}/bench/torpor-{round_no}:ckpt"
        skopeo_ref = f"{host}/bench/skopeo-{round_no}:ckpt"
        torpor_out, skopeo_out = base / f"torpor-out-{round_no}", base / f"skopeo-out-{round_no}"
        steps = {
            "torpor push": [sys.executable, "-c", TORPOR_PUSH, str(layout.root), torpor_ref],
            "skopeo push": ["skopeo", "copy", "--all", "--dest-tls-verify=false",
                            f"oci:{layout.root}:ckpt-1", f"docker://{skopeo_ref}"],
            "torpor pull": [sys.executable, "-c", TORPOR_PULL, torpor_ref, str(torpor_out)],
            "torpor+fsync pull": [sys.executable, "-c", TORPOR_PULL_FSYNC, torpor_ref, f"{torpor_out}-fsync"],
            "skopeo pull": ["skopeo", "copy", "--all", "--src-tls-verify=false", f"docker://{skopeo_ref}",
                            f"oci:{skopeo_out}:ckpt"],
        }
        order = list(steps) if round_no % 2 == 0 else list(reversed(steps))
        seconds = {}
        for phase in ("push", "pull"):
            for step in order:
                if step.endswith(phase):
                    seconds[step] = timed(steps[step])
                    if phase == "pull":  # free the copy's page cache for the next step (see main)
                        shutil.rmtree(steps[step][-1].removeprefix("oci:").removesuffix(":ckpt"))
    finally:
        registry.stop()
        shutil.rmtree(registry.dir, ignore_errors=True)
    total_mib = sum(layout.blobs.values()) / MIB
    return {step: total_mib / s for step, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers-mib", default="96,96,64,64", help="state layer sizes in MiB")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    layer_sizes = tuple(int(x) * MIB for x in args.layers_mib.split(","))
    base = Path(tempfile.mkdtemp(prefix="torpor-bench-registry-", dir="/var/tmp"))
    try:
        layout = write_checkpoint_layout(base / "layout", state_layer_sizes=layer_sizes, nested=False)
        rounds = [one_round(base, layout, n) for n in range(args.rounds)]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    median = {step: statistics.median(r[step] for r in rounds) for step in rounds[0]}
    total_mib = sum(layer_sizes) / MIB
    print(f"layout: {len(layer_sizes)} state layers, {total_mib:.0f} MiB in all; {args.rounds} rounds; "
          f"docker-registry on 127.0.0.1; MB/s = MiB moved / wall seconds (median)")
    print(f"{'':12}{'torpor MB/s':>14}{'skopeo MB/s':>14}{'torpor/skopeo':>16}")
    rows = [("push", "torpor push"), ("pull", "torpor pull"), ("pull+fsync", "torpor+fsync pull")]
    for label, step in rows:
        torpor, skopeo = median[step], median[f"skopeo {label.split('+')[0]}"]
        print(f"{label:12}{torpor:14.0f}{skopeo:14.0f}{torpor / skopeo:16.2f}")
    for n, r in enumerate(rounds):
        print(f"round {n}: " + ", ".join(f"{step} {value:.0f}" for step, value in r.items()))


if __name__ == "__main__":
    main()
