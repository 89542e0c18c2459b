"""A checkpoint pushed while CRIU still writes (docs/format.md, "Packed and sent while CRIU
writes"), at the real threshold, on real containerd, CRIU and docker-registry: a container
holding 3 GiB of incompressible memory, whose pages image passes 2 GiB during the dump, has
packs of it sent before the dump is over; the registry takes the image's manifests (every blob
they name is there), and the container restored from it holds the same memory."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Nodes, run_torpor
from .support.containerd import Node
from .support.processes import wait_for
from .support.registry import Registry
from .support.workload import containers, exec_out
from .test_generations import node_config

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]
MEMORY_MIB = 3072


@pytest.fixture(scope="module")
def early_node(nodes: Nodes, session_dir: Path) -> Node:
    return nodes.start("early", config=node_config(session_dir, "early"))


@pytest.fixture(scope="module")
def registry(session_dir: Path) -> Iterator[Registry]:
    started = Registry(session_dir / "registries", "early").start()
    yield started
    started.stop()


def rewrite_checksum(node: Node, name: str) -> str:
    """memhog's checksum after its first rewrite (SIGUSR2): the same from the same memory."""
    node.ctr("tasks", "kill", "--signal", signal.SIGUSR2.name, name)
    status = wait_for(lambda: exec_out(node, name, "sh", "-c", "cat /tmp/status 2>/dev/null; true")
                      .strip() or None, what=f"{name}'s rewrite", timeout=60)
    assert status.startswith("rewrites 1 checksum "), status
    return str(status)


def test_packs_of_a_big_dump_go_up_while_criu_writes_and_it_restores_whole(
        early_node: Node, registry: Registry, test_image: dict[str, object],
        session_dir: Path) -> None:
    node, name = early_node, "early-big"
    with containers(node) as names:
        names.append(name)
        node.ctr("run", "-d", *SHIM, str(test_image["name"]), name,
                 "memhog", str(MEMORY_MIB), "/tmp/gap", "-s", "/tmp/status")
        wait_for(lambda: "yes" in exec_out(node, name, "sh", "-c", "test -e /tmp/gap && echo yes;"
                                           " true"), what="memhog's memory filled", timeout=60)
        for attempt in range(3):
            ref = f"{registry.host}/early/{name}:{attempt}"
            result = json.loads(run_torpor(node, "checkpoint", name, "-t", ref, "--push",
                                           "--leave-running", "--volumes", "none",
                                           "--json").stdout)
            print(f"packed and sent during the dump: {result['early_packed_bytes'] >> 20} MiB "
                  f"of {MEMORY_MIB} MiB, cut: {result['followed_bytes'] >> 20} MiB, dump "
                  f"{result['timings']['dump_s']:.2f} s")
            if result["early_packed_bytes"]:
                break
            # CRIU and its parasite can hold both cores of a busy two-core machine to the
            # dump's end, leaving nothing to the niced packer: again, as a first generation
            run_torpor(node, "rm", ref)
        assert result["early_packed_bytes"] > 0, result
        assert result["pushed"]["bytes_uploaded"] >= MEMORY_MIB << 20
        assert result["pushed"]["existing"] >= 0, result["pushed"]
        # nothing, early packs included, is left in the image store's scratch
        assert not [p for p in (session_dir / "early-store" / "scratch").rglob("*")
                    if not p.is_dir()]
        expected = rewrite_checksum(node, name)
        restored = f"{name}-restored"
        names.append(restored)
        run_torpor(node, "restore", ref, "--name", restored)
        assert rewrite_checksum(node, restored) == expected
