"""containerd's registry host configuration (hosts.toml), as ctr and nerdctl read it: pulls go
through the mirrors and pull-through caches it names, pushes to the host that may push, against
real docker-registry processes (one of them a pull-through cache of the other)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from torpor.errors import RegistryError
from torpor.registry import fetch_metadata, pull, push_layout

from ..support.checkpoint_layouts import WrittenLayout
from ..support.processes import wait_for
from ..support.registry import Registry
from .conftest import FAST

pytestmark = pytest.mark.real


def hosts_toml(directory: Path, registry: str, text: str) -> Path:
    (directory / registry).mkdir(parents=True, exist_ok=True)
    (directory / registry / "hosts.toml").write_text(text)
    return directory


def blob_gets(registry: Registry, mark: int) -> list[str]:
    return [r.split()[1].split("?")[0].rsplit("/", 1)[1] for r in registry.requests_since(mark)
            if r.startswith("GET ") and "/blobs/" in r]


def test_two_nodes_pull_through_one_cache_and_the_second_costs_the_origin_nothing(
        start_registry: Callable[..., Registry], layout: WrittenLayout, tmp_path: Path) -> None:
    origin = start_registry("origin")
    cache = start_registry("cache", proxy_of=f"http://{origin.host}")
    ref = f"{origin.host}/team/web1:ckpt-1"
    pushed = push_layout(layout.root, ref, options=FAST)
    hosts = hosts_toml(tmp_path / "certs.d", origin.host,
                       f'server = "http://{origin.host}"\n'
                       f'[host."http://{cache.host}"]\n  capabilities = ["pull", "resolve"]\n')
    options = dataclasses.replace(FAST, hosts_dir=hosts)
    served: dict[str, list[str]] = {}
    cache_mark = cache.log_mark()
    for node in ("node-a", "node-b"):
        origin_mark = origin.log_mark()
        pulled = pull(ref, tmp_path / node, options=options)
        # the cache stores what it fetched after answering: wait for it, then count
        wait_for(lambda: all(cache.blob_data(d).exists() for d in layout.blobs),
                 what="the cache to store every blob")
        origin.wait_quiet()
        served[node] = blob_gets(origin, origin_mark)
        assert pulled.digest == pushed.digest
        for digest in layout.blobs:
            name = digest.split(":")[1]
            assert (tmp_path / node / "blobs/sha256" / name).read_bytes() == \
                (layout.root / "blobs/sha256" / name).read_bytes()
    # the first node's pull filled the cache from the origin (distribution 2.8's proxy reads
    # a blob from its remote twice on a miss); the second's came from the cache alone
    assert set(served["node-a"]) == set(layout.blobs)
    assert served["node-b"] == []
    assert sorted(blob_gets(cache, cache_mark)) == sorted([*layout.blobs, *layout.blobs])
    assert all("ns=" in r for r in cache.requests_since(cache_mark) if "/v2/team" in r)


def test_pushes_go_to_the_host_that_may_push(start_registry: Callable[..., Registry],
                                            layout: WrittenLayout, tmp_path: Path) -> None:
    """A `server` elsewhere than the name says (an origin behind a name), a mirror that may
    only pull: the push lands on the server and nothing is sent to the mirror."""
    origin = start_registry("origin")
    mirror = start_registry("mirror")
    hosts = hosts_toml(tmp_path / "certs.d", "registry.example:5000",
                       f'server = "http://{origin.host}"\n'
                       f'[host."http://{mirror.host}"]\n  capabilities = ["pull", "resolve"]\n')
    options = dataclasses.replace(FAST, hosts_dir=hosts)
    mirror_mark = mirror.log_mark()
    pushed = push_layout(layout.root, "registry.example:5000/team/web1:1", options=options)
    assert mirror.requests_since(mirror_mark) == []
    # the mirror lacks it: passed over, the server has it
    with fetch_metadata("registry.example:5000/team/web1:1", options) as plan:
        assert plan.top.descriptor.digest == pushed.digest
    assert any("/manifests/1" in r for r in mirror.requests_since(mirror_mark))


def test_a_mirror_that_lies_is_passed_over_and_a_dead_one_named(
        start_registry: Callable[..., Registry], layout: WrittenLayout, tmp_path: Path) -> None:
    """Nothing a mirror serves is trusted: a manifest that is not the digest asked for is
    refused and the next host asked; with every host failing, the error names each."""
    origin = start_registry("origin")
    liar = start_registry("liar")
    ref = f"{origin.host}/team/web1:1"
    pushed = push_layout(layout.root, ref, options=FAST)
    push_layout(layout.root, f"{liar.host}/team/web1:1", options=FAST)
    stored = liar.blob_data(pushed.digest)
    stored.write_bytes(stored.read_bytes().replace(b"sha256:", b"sha256;", 1))  # same size
    hosts = hosts_toml(tmp_path / "certs.d", origin.host,
                       f'server = "http://{origin.host}"\n'
                       f'[host."http://{liar.host}"]\n  capabilities = ["pull", "resolve"]\n')
    options = dataclasses.replace(FAST, hosts_dir=hosts)
    mark = liar.log_mark()
    with fetch_metadata(f"{origin.host}/team/web1@{pushed.digest}", options) as plan:
        assert plan.top.descriptor.digest == pushed.digest
    assert any(f"/manifests/{pushed.digest}" in r for r in liar.requests_since(mark))
    liar.stop()
    origin.stop()
    with pytest.raises(RegistryError) as failed:
        fetch_metadata(ref, dataclasses.replace(options, retries=0))
    assert f"http://{liar.host} (mirror" in failed.value.message, failed.value.message


def test_podman_s_registries_conf_mirror_with_another_repository_name(
        start_registry: Callable[..., Registry], layout: WrittenLayout, tmp_path: Path) -> None:
    """Where no hosts.toml names the registry, registries.conf does (Podman users): the pull
    takes the mirror's copy under its own repository name, the origin serving no blob."""
    origin = start_registry("origin")
    mirror = start_registry("mirror")
    pushed = push_layout(layout.root, f"{origin.host}/team/web1:1", options=FAST)
    push_layout(layout.root, f"{mirror.host}/copies/web1:1", options=FAST)
    conf = tmp_path / "registries.conf"
    conf.write_text(f'[[registry]]\nprefix = "{origin.host}/team"\nlocation = "{origin.host}/team"\n'
                    f'[[registry.mirror]]\nlocation = "{mirror.host}/copies"\n')
    options = dataclasses.replace(FAST, hosts_dir=tmp_path / "no-certs.d", registries_conf=conf)
    origin_mark, mirror_mark = origin.log_mark(), mirror.log_mark()
    pulled = pull(f"{origin.host}/team/web1:1", tmp_path / "pulled", options=options)
    assert pulled.digest == pushed.digest
    assert blob_gets(origin, origin_mark) == []
    assert sorted(set(blob_gets(mirror, mirror_mark))) == sorted(layout.blobs)
    asked = mirror.requests_since(mirror_mark)
    assert asked and all(r.split()[1].startswith("/v2/copies/web1/") for r in asked), asked
    assert origin.requests_since(origin_mark) == []
