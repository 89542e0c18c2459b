"""Restores through the registry tier a cluster already has: two nodes whose containerd host
configuration (certs.d/<registry>/hosts.toml) puts a pull-through cache (docker-registry's
proxy mode) in front of the origin. torpor reads it as ctr and nerdctl do: the checkpoint is
pushed to the origin, both nodes restore through the cache, and the origin serves the second
node nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Nodes, run_torpor
from .support.containerd import Node
from .support.processes import wait_for
from .support.registry import Registry
from .support.workload import (
    COUNTER,
    containers,
    read_counter,
    wait_counter_above,
)

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]


@pytest.fixture(scope="module")
def tier(session_dir: Path) -> Iterator[tuple[Registry, Registry, Path]]:
    base = session_dir / f"mirrors-{uuid.uuid4().hex[:6]}"
    origin = Registry(base, "origin").start()
    cache = Registry(base, "cache", proxy_of=f"http://{origin.host}").start()
    hosts = base / "certs.d"
    (hosts / origin.host).mkdir(parents=True)
    (hosts / origin.host / "hosts.toml").write_text(
        f'server = "http://{origin.host}"\n\n[host."http://{cache.host}"]\n'
        '  capabilities = ["pull", "resolve"]\n')
    yield origin, cache, hosts
    cache.stop()
    origin.stop()


def mirror_node(nodes: Nodes, session_dir: Path, name: str, hosts: Path) -> Node:
    config = session_dir / f"{name}.toml"
    config.write_text(f'[runtime]\nstate_dir = "{session_dir}/{name}-state"\n'
                      f'log_dir = "{session_dir}/{name}-state-logs"\n'
                      f'[image]\nstore = "{session_dir}/{name}-store"\n'
                      f'[registry]\nhosts_dir = "{hosts}"\n')
    return nodes.start(name, config=config)


def blob_gets(registry: Registry, mark: int) -> list[str]:
    return [r.split("?")[0].rsplit("/", 1)[1] for r in registry.requests_since(mark)
            if r.startswith("GET ") and "/blobs/" in r]


def test_two_nodes_restore_through_the_cache(nodes: Nodes, session_dir: Path,
                                             tier: tuple[Registry, Registry, Path],
                                             test_image: dict[str, object]) -> None:
    origin, cache, hosts = tier
    a = mirror_node(nodes, session_dir, "mirror-a", hosts)
    b = mirror_node(nodes, session_dir, "mirror-b", hosts)
    name = "through-cache"
    ref = f"{origin.host}/tier/{name}:1"
    with containers(a) as on_a, containers(b) as on_b:
        on_a.append(name)
        a.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c", COUNTER)
        at_checkpoint = wait_counter_above(a, name, 40)   # a cold start reads less for 2 s
        cache_mark = cache.log_mark()
        run_torpor(a, "checkpoint", name, "-t", ref, "--push")
        assert cache.requests_since(cache_mark) == []      # pushes go to the server only
        layers = origin.layer_digests(f"tier/{name}", "1")
        run_torpor(a, "rm", ref)                            # the node's own copy

        served = {}
        for node, restored in ((a, "via-cache-a"), (b, "via-cache-b")):
            (on_a if node is a else on_b).append(restored)
            mark = origin.log_mark()
            run_torpor(node, "restore", ref, "--name", restored)
            wait_for(lambda: all(cache.blob_data(d).exists() for d in layers),
                     what="the cache to store every layer")   # it stores after answering
            origin.wait_quiet()
            served[restored] = [d for d in blob_gets(origin, mark) if d in layers]
            assert read_counter(node, restored) >= at_checkpoint   # its memory, not a new start
            wait_counter_above(node, restored, read_counter(node, restored))
        assert served["via-cache-a"]             # the cache filled itself from the origin
        assert served["via-cache-b"] == []       # the second node cost the origin nothing
        got = [d for d in blob_gets(cache, cache_mark) if d in layers]
        assert sorted(set(got)) == sorted(layers) and len(got) == 2 * len(layers)
