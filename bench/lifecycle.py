"""Container lifecycle through containerd: torpor-runc against bare runc, interleaved.

Each round creates, starts, kills (SIGKILL), waits for and deletes a trivial container through
containerd, once with bare runc and once with torpor-runc (runtime io.containerd.runc.v2,
BinaryName = torpor-runc), alternating so that drift hits both alike, two ways:

  api  torpor's gRPC client straight to containerd: nothing but containerd, the shim, the runtime
  ctr  what a user types: `ctr run -d`, `ctr tasks delete --force`, `ctr containers rm`

It prints the median round time of each, their ratio and the milliseconds torpor-runc adds per
runtime call. The shim calls the runtime five times a round (create, start, kill, delete, and
`delete --force` when the shim exits); runc also runs torpor-hook twice (createRuntime,
poststop), which is counted in the calls it belongs to.

    python -m bench.lifecycle [--rounds 30] [--via api|ctr|both] [--on-create signed]

`--on-create MODE` sets the node's `[restore] on_create` (docs/containerd.md): torpor-runc then
reads each `create`'s config.json for a checkpoint image's mark, and stats a file on `start`.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from typing import Any

from bench.harness import IMAGE, world
from tests.support.containerd import Node
from torpor.containerd import images as containerd_image
from torpor.containerd.api import containers_pb2, tasks_pb2
from torpor.containerd.client import Client
from torpor.containerd.runtime import RUNC_SHIM, SPEC_TYPE_URL, pack_any, runc_options
from torpor.formats.metadata import RuntimeInfo
from torpor.formats.oci import OciSpec

RUNTIME_CALLS_PER_ROUND = 5


def one_round(client: Client, spec: OciSpec, chain_id: str, name: str,
              binary: str | None) -> float:
    spec = json.loads(json.dumps(spec))
    spec["linux"]["cgroupsPath"] = f"/{client.namespace}/{name}"
    options = runc_options(RuntimeInfo(RUNC_SHIM, binary_name=binary)) if binary else None
    start = time.perf_counter()
    with client.lease():  # as ctr does: nothing unreferenced is collected in between
        mounts = client.prepare_snapshot("overlayfs", name, chain_id)
        client.create_container(containers_pb2.Container(
            id=name, image=IMAGE, snapshotter="overlayfs", snapshot_key=name,
            runtime=containers_pb2.Container.Runtime(name="io.containerd.runc.v2",
                                                     options=options),
            spec=client_spec(spec)))
    client.create_task(tasks_pb2.CreateTaskRequest(container_id=name, rootfs=mounts))
    client.start_task(name)
    client.kill_task(name, signal.SIGKILL)
    client.wait_task(name)
    client.delete_task(name)
    client.remove_snapshot("overlayfs", name)
    client.delete_container(name)
    return time.perf_counter() - start


def client_spec(spec: OciSpec) -> Any:

    return pack_any(SPEC_TYPE_URL, json.dumps(spec).encode())


def ctr_round(node: Node, name: str, runtime: list[str]) -> float:
    start = time.perf_counter()
    node.ctr("run", "-d", *runtime, IMAGE, name, "sleep", "600")
    node.ctr("tasks", "delete", "--force", name)
    node.ctr("containers", "rm", name)
    return time.perf_counter() - start


def report(label: str, rounds: int, times: dict[str, list[float]]) -> None:
    bare = statistics.median(times["runc"]) * 1000
    torpor = statistics.median(times["torpor-runc"]) * 1000
    added = (torpor - bare) / RUNTIME_CALLS_PER_ROUND
    print(f"[{label}] {rounds} rounds each, interleaved")
    print(f"  bare runc:    median {bare:7.1f} ms per container lifecycle")
    print(f"  torpor-runc:  median {torpor:7.1f} ms per container lifecycle")
    print(f"  ratio:        {torpor / bare:.3f}")
    print(f"  added:        {added:.1f} ms per runtime call "
          f"({RUNTIME_CALLS_PER_ROUND} runtime calls per round, no hooks)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--via", choices=("api", "ctr", "both"), default="both")
    parser.add_argument("--on-create", choices=("off", "signed", "on"), default="off")
    args = parser.parse_args()
    with world() as w:
        w.config.write_text(w.config.read_text().replace(
            "[restore]\n", f'[restore]\non_create = "{args.on_create}"\n'))
        node = w.node("bench")
        torpor_runc = str(w.bin / "torpor-runc")
        if args.via in ("api", "both"):
            node.ctr("containers", "create", IMAGE, "template", "sleep", "3600")
            with Client(node.address, node.namespace) as client:
                spec = json.loads(client.get_container("template").spec.value)
                node.ctr("containers", "delete", "template")
                chain = containerd_image.image_chain(client, IMAGE).chain_id
                times: dict[str, list[float]] = {"runc": [], "torpor-runc": []}
                for warm in range(3):
                    one_round(client, spec, chain, f"warm-{warm}", None)
                    one_round(client, spec, chain, f"warm-t{warm}", torpor_runc)
                for i in range(args.rounds):
                    order = [("runc", None), ("torpor-runc", torpor_runc)]
                    for label, binary in (order if i % 2 else order[::-1]):
                        times[label].append(one_round(client, spec, chain, f"r{i}-{label}", binary))
            report("api", args.rounds, times)
        if args.via in ("ctr", "both"):
            runtimes = {"runc": ["--runtime", "io.containerd.runc.v2"],
                        "torpor-runc": ["--runtime", "io.containerd.runc.v2", "--runc-binary",
                                        torpor_runc]}
            times = {"runc": [], "torpor-runc": []}
            for i in range(args.rounds + 2):
                for label in (("runc", "torpor-runc") if i % 2 else ("torpor-runc", "runc")):
                    elapsed = ctr_round(node, f"c{i}-{label}", runtimes[label])
                    if i >= 2:
                        times[label].append(elapsed)
            report("ctr", args.rounds, times)
    return 0


if __name__ == "__main__":
    sys.exit(main())
