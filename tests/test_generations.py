"""Generations of checkpoint images on real containerd, CRIU and docker-registry: a second
checkpoint sends only what changed (the exact figures are bench/generations.py's, the bounds
here are generous), a node that holds a generation pulls only the next one's new blobs, the
estimate made beforehand is close to what the checkpoint stores, and the periodic mode keeps
the newest generations, locally and in the registry, each of them restorable."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Nodes, run_torpor
from .support.containerd import Node
from .support.processes import reaped, wait_for
from .support.registry import Registry
from .support.workload import (
    COUNTER,
    containers,
    exec_out,
    kv_ask,
    read_counter,
    read_file,
    wait_counter_above,
    wait_kv,
)

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]
MEMORY_MIB = 64


def node_config(session_dir: Path, name: str) -> Path:
    path = session_dir / f"node-{name}.toml"
    path.write_text(f'[runtime]\nstate_dir = "{session_dir}/{name}-state"\n'
                    f'log_dir = "{session_dir}/{name}-state-logs"\n'
                    f'[image]\nstore = "{session_dir}/{name}-store"\n')
    return path


@pytest.fixture(scope="module")
def gen_nodes(nodes: Nodes, session_dir: Path) -> tuple[Node, Node]:
    return (nodes.start("gen-a", config=node_config(session_dir, "gen-a")),
            nodes.start("gen-b", config=node_config(session_dir, "gen-b")))


@pytest.fixture(scope="module")
def registry(session_dir: Path) -> Iterator[Registry]:
    started = Registry(session_dir / "registries", "generations").start()
    yield started
    started.stop()


def checkpoint_json(node: Node, *args: str) -> dict:  # type: ignore[type-arg]
    return json.loads(run_torpor(node, "checkpoint", *args, "--json").stdout)  # type: ignore[no-any-return]


def within(estimated: int, actual: int, fraction: float) -> bool:
    return abs(estimated - actual) <= fraction * actual


def test_a_next_generation_stores_and_sends_what_changed(
        gen_nodes: tuple[Node, Node], registry: Registry,
        test_image: dict[str, object]) -> None:
    a, b = gen_nodes
    name = "dedup"
    refs = [f"{registry.host}/gen/{name}:{n}" for n in (1, 2, 3)]
    with containers(a) as names:
        names.append(name)
        a.ctr("run", "-d", *SHIM, str(test_image["name"]), name,
              "memhog", str(MEMORY_MIB), "-s", "/tmp/rewrites")
        wait_for(lambda: "memhog" in exec_out(a, name, "ps"), what="memhog")
        time.sleep(1)  # filled
        estimate1 = json.loads(run_torpor(a, "estimate", name, "--json").stdout)
        assert estimate1["previous"] == ""
        first = checkpoint_json(a, name, "-t", refs[0], "--push", "--leave-running")
        # unchanged: the same chunks, the same small layers; new are the index and metadata
        second = checkpoint_json(a, name, "-t", refs[1], "--push", "--leave-running")
        assert second["previous"] == refs[0]
        sent = [first["pushed"]["bytes_uploaded"], second["pushed"]["bytes_uploaded"]]
        assert sent[1] <= 0.05 * sent[0], sent
        assert second["new_bytes"] <= 0.05 * first["new_bytes"]
        # one measure (docs/generations.md): the new part of a generation is part of what it
        # stores, and a first generation's new bytes are all it stores
        assert first["new_bytes"] == first["compressed_bytes"], first
        assert 0 < second["new_bytes"] < second["compressed_bytes"], second
        # 10% of the memory rewritten in one region
        a.ctr("tasks", "kill", "--signal", "SIGUSR2", name)
        wait_for(lambda: "rewrites 1" in exec_out(a, name, "sh", "-c",
                                                   "cat /tmp/rewrites 2>/dev/null; true"),
                 what="memhog's rewrite")
        estimate3 = json.loads(run_torpor(a, "estimate", name, "--json").stdout)
        assert estimate3["previous_ref"] == refs[1]
        third = checkpoint_json(a, name, "-t", refs[2], "--push", "--leave-running")
        sent.append(third["pushed"]["bytes_uploaded"])
        assert 0.05 * sent[0] < sent[2] <= 0.2 * sent[0], sent
        # the estimates against what was stored (bench/generations.py has the exact figures)
        info1 = json.loads(run_torpor(a, "inspect", refs[0], "--json").stdout)["generation"]
        assert info1["stored_bytes"] == first["compressed_bytes"], (info1, first)
        assert within(estimate1["full_bytes"], info1["stored_bytes"], 0.25), \
            (estimate1, info1)
        info3 = json.loads(run_torpor(a, "inspect", refs[2], "--json").stdout)["generation"]
        assert info3["estimate_new_bytes"] == estimate3["new_bytes"]
        assert within(estimate3["new_bytes"], info3["new_bytes"], 0.25), (estimate3, info3)
        assert "estimate" in run_torpor(a, "inspect", refs[2]).stdout
        # the same reference again: its old entry is replaced, its packs carried over
        again = checkpoint_json(a, name, "-t", refs[2], "--leave-running")
        assert again["previous"] == refs[2] and again["new_bytes"] <= 0.05 * first["new_bytes"]
        names.append(f"{name}-again")
        run_torpor(a, "restore", refs[2], "--name", f"{name}-again")
        assert "rewrites 1" in read_file(a, f"{name}-again", "/tmp/rewrites")
    # B holds generation 1; generation 3 brings only its new packs
    pulled1 = json.loads(run_torpor(b, "pull", refs[0], "--json").stdout)
    pulled3 = json.loads(run_torpor(b, "pull", refs[2], "--json").stdout)
    assert pulled3["bytes_downloaded"] <= 0.25 * pulled1["bytes_downloaded"], (pulled1, pulled3)
    with containers(b) as names:  # and generation 3 is whole: it restores
        names.append(name)
        run_torpor(b, "restore", refs[2])
        b.ctr("tasks", "kill", "--signal", "SIGUSR2", name)
        wait_for(lambda: "rewrites 2" in exec_out(b, name, "sh", "-c",
                                                   "cat /tmp/rewrites 2>/dev/null; true"),
                 what="the restored memhog's second rewrite")


def periodic(node: Node, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(node.bin_dir / "torpor"), "checkpoint", *args, "--json"],
                            env=node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def local_refs(node: Node, repository: str) -> list[str]:
    listed = json.loads(run_torpor(node, "ls", "--json").stdout)
    return sorted(e["ref"] for e in listed if e["ref"].startswith(repository + ":"))


def registry_tags(registry: Registry, repository: str) -> list[str]:
    out = subprocess.run(["skopeo", "list-tags", "--tls-verify=false",
                          f"docker://{registry.host}/{repository}"], capture_output=True,
                         text=True, check=True).stdout
    return sorted(json.loads(out)["Tags"])


def test_periodic_checkpoints_keep_the_newest_and_each_restores(
        gen_nodes: tuple[Node, Node], registry: Registry, session_dir: Path,
        test_image: dict[str, object]) -> None:
    a, _ = gen_nodes
    name = "periodic"
    repository = f"{registry.host}/gen/{name}"
    with containers(a) as names:
        names.append(name)
        a.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c",
              f"kvserver 7000 & {COUNTER}")
        wait_kv(a, name)
        assert kv_ask(a, name, "SET kept yes") == "OK"
        # a checkpoint the user made under the series' name before (as `make demo` does): one
        # of its generations for --keep, the oldest, so the first to go
        run_torpor(a, "checkpoint", name, "-t", f"{repository}:ck-1", "--push",
                   "--leave-running")
        series = periodic(a, name, "-t", f"{repository}:ck", "--every", "2s", "--keep", "2",
                          "--push")
        rounds: list[dict] = []  # type: ignore[type-arg]
        try:
            assert series.stdout is not None
            while len(rounds) < 4:
                line = series.stdout.readline()
                assert line, series.stderr.read() if series.stderr else ""
                rounds.append(json.loads(line))
                assert rounds[-1]["error"] is None, rounds[-1]
                made = rounds[-1]["result"]
                assert made["new_bytes"] <= made["compressed_bytes"], made
            series.send_signal(signal.SIGTERM)
            assert series.wait(timeout=120) == 0
        finally:
            if series.poll() is None:
                series.kill()
                series.wait()
        generations = [r["ref"] for r in rounds]
        assert all(g.startswith(f"{repository}:ck-") for g in generations)
        assert rounds[-1]["result"]["previous"] in [*generations[:-1], f"{repository}:ck"]
        kept = sorted(generations[-2:])
        # the two newest generations and the moving tag, here and in the registry
        assert local_refs(a, repository) == sorted([f"{repository}:ck", *kept])
        assert registry_tags(registry, f"gen/{name}") == sorted(
            ["ck", *(g.rsplit(":", 1)[1] for g in kept)])
        assert read_counter(a, name) > 0  # the container ran on throughout
        before = wait_counter_above(a, name, 0)
    # every kept generation restores, from the local store and from the registry
    for i, ref in enumerate([*kept, f"{repository}:ck"]):
        restored = f"{name}-r{i}"
        with containers(a) as names:
            names.append(restored)
            run_torpor(a, "restore", ref, "--name", restored)
            assert kv_ask(a, restored, "GET kept") == "yes"
            assert read_counter(a, restored) >= before // 2
    # prune: one generation of the two goes, locally and in the registry; the other restores
    out = json.loads(run_torpor(a, "prune", repository, "--keep", "1", "--registry",
                                "--json").stdout)
    assert out["removed"] == [kept[0]] and out["registry_error"] is None
    # one generation kept in each, though two tags name it (the moving tag is on its index)
    assert (out["kept_generations"], len(out["kept"])) == (1, 2)
    assert (out["registry_kept_generations"], len(out["registry_kept"])) == (1, 2)
    assert local_refs(a, repository) == sorted([f"{repository}:ck", kept[1]])
    assert registry_tags(registry, f"gen/{name}") == sorted(["ck", kept[1].rsplit(":", 1)[1]])
    run_torpor(a, "rm", f"{repository}:ck")
    with containers(a) as names:
        names.append(f"{name}-last")
        run_torpor(a, "restore", kept[1], "--name", f"{name}-last")
        assert kv_ask(a, f"{name}-last", "GET kept") == "yes"


def test_a_registry_that_refuses_deletes_is_named(gen_nodes: tuple[Node, Node],
                                                  session_dir: Path,
                                                  test_image: dict[str, object]) -> None:
    a, _ = gen_nodes
    frozen = Registry(session_dir / "registries", "no-deletes", delete=False).start()
    name = "undeletable"
    repository = f"{frozen.host}/gen/{name}"
    try:
        with containers(a) as names:
            names.append(name)
            a.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c", COUNTER)
            wait_counter_above(a, name, 2)
            for n in (1, 2):
                run_torpor(a, "checkpoint", name, "-t", f"{repository}:{n}", "--push",
                           "--leave-running")
        result = run_torpor(a, "prune", repository, "--keep", "1", "--registry", check=False)
        assert result.returncode == 1
        assert "does not allow deleting" in result.stderr
        assert "REGISTRY_STORAGE_DELETE_ENABLED=true" in result.stderr
        assert local_refs(a, repository) == [f"{repository}:2"]  # the local part is done
    finally:
        frozen.stop()


def plant_lying_copy(store_root: Path, genuine: str, planted: str, container: str) -> None:
    """A copy of the image `genuine` of the store under `planted`, its chunk index lying (the
    digests of its first two chunks swapped: every record still well-formed), its index claiming
    to be `container`'s newest image (created in 9999): what a hostile image pulled into the
    store can say of itself."""
    import hashlib
    import shutil

    import zstandard

    from torpor.image.store import Store

    from .support import oci_edit

    def lie(state: dict, metadata: dict, layout: Path) -> None:  # type: ignore[type-arg]
        layer = next(d for d in state["layers"] if "chunk-index" in d["mediaType"])
        body = json.loads(zstandard.ZstdDecompressor().decompress(
            (layout / "blobs" / "sha256" / layer["digest"].split(":")[1]).read_bytes()))
        body["chunks"][0][0], body["chunks"][1][0] = body["chunks"][1][0], body["chunks"][0][0]
        data = zstandard.ZstdCompressor().compress(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
        layer.update(oci_edit.blob(layout, layer["mediaType"], data))

    store = Store(str(store_root))
    with store.staging(planted) as version:
        shutil.copytree(store.layout(genuine), version, dirs_exist_ok=True)
        oci_edit.edit(version, lie)
        index_json = json.loads((version / "index.json").read_text())
        top = index_json["manifests"][0]
        index_path = version / "blobs" / "sha256" / top["digest"].split(":")[1]
        index = json.loads(index_path.read_bytes())
        index["annotations"].update({"io.torpor.checkpoint.container": container,
                                     "org.opencontainers.image.created": "9999-12-31T23:59:59Z"})
        data = json.dumps(index).encode()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        (version / "blobs" / "sha256" / digest.split(":")[1]).write_bytes(data)
        top.update(digest=digest, size=len(data))
        (version / "index.json").write_text(json.dumps(index_json))


def test_a_hostile_image_in_the_store_does_not_poison_the_next_generation(
        gen_nodes: tuple[Node, Node], registry: Registry, session_dir: Path,
        test_image: dict[str, object]) -> None:
    """Images claiming to be the container's newest (and one under the very reference the
    checkpoint writes) whose chunk records lie: the next generation builds on the node's own
    one, and the container it stopped restores with its state."""
    a, _ = gen_nodes
    name = "poisoned"
    repository = f"{registry.host}/gen/{name}"
    store_root = session_dir / "gen-a-store"
    with containers(a) as names:
        names.append(name)
        a.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c",
              f"kvserver 7000 & {COUNTER}")
        wait_kv(a, name)
        assert kv_ask(a, name, "SET kept yes") == "OK"
        first = checkpoint_json(a, name, "-t", f"{repository}:1", "--leave-running")
        plant_lying_copy(store_root, f"{repository}:1", f"{registry.host}/evil/x:1", name)
        plant_lying_copy(store_root, f"{repository}:1", f"{repository}:2", name)
        before = wait_counter_above(a, name, 0)
        second = checkpoint_json(a, name, "-t", f"{repository}:2")  # stops the container
        names.append(f"{name}-b")
        run_torpor(a, "restore", f"{repository}:2", "--name", f"{name}-b")
        assert kv_ask(a, f"{name}-b", "GET kept") == "yes"
        assert wait_counter_above(a, f"{name}-b", before) > before
        assert second["previous"] == f"{repository}:1", second  # built on the node's own
        assert second["new_bytes"] < first["new_bytes"], (first, second)


def test_replicas_restored_at_once_download_one_copy(
        gen_nodes: tuple[Node, Node], registry: Registry, test_image: dict[str, object],
        session_dir: Path) -> None:
    """A node scaling a warmed server from one replica to four starts the restores together:
    each layer comes down once (the others wait for it and take it from the node's store),
    and every replica runs on from the checkpointed state."""
    a, b = gen_nodes
    name = "replicas"
    ref = f"{registry.host}/gen/{name}:1"
    replicas = [f"replica-{n}" for n in range(4)]
    with containers(a) as on_a, containers(b) as on_b, reaped() as started:
        on_a.append(name)
        a.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c",
              f"memhog {MEMORY_MIB // 2} & {COUNTER}")
        wait_for(lambda: "memhog" in exec_out(a, name, "ps"), what="memhog")
        time.sleep(1)  # filled
        at_checkpoint = read_counter(a, name)
        run_torpor(a, "checkpoint", name, "-t", ref, "--push")
        layers = registry.layer_digests(f"gen/{name}", "1")

        mark = registry.log_mark()
        on_b += replicas
        started += [subprocess.Popen([str(b.bin_dir / "torpor"), "restore", ref, "--name", r],
                                     env=b.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True) for r in replicas]
        outputs = [p.communicate(timeout=300)[0] for p in started]
        assert [p.returncode for p in started] == [0] * 4, outputs
        blob_gets = [r.rsplit("/", 1)[1] for r in registry.requests_since(mark)
                     if r.startswith("GET ") and "/blobs/" in r]
        layer_gets = sorted(d for d in blob_gets if d in layers)
        # each layer at most once (some the node's store may hold already); 4 times before
        assert layer_gets and len(layer_gets) == len(set(layer_gets)), layer_gets
        assert not list((session_dir / "gen-b-store" / "locks").glob("*"))   # no lock left
        for replica in replicas:
            assert wait_counter_above(b, replica, at_checkpoint) > at_checkpoint
            assert "memhog" in exec_out(b, replica, "ps")


def own_blobs(layout: Path) -> dict[str, int]:
    """The blobs of an OCI layout that the checkpoint made (digest -> size): all but the base
    image's layers (the runnable manifest's layers but its last, the read-write layer)."""
    blobs = layout / "blobs" / "sha256"

    def doc(digest: str) -> dict:  # type: ignore[type-arg]
        return json.loads((blobs / digest.removeprefix("sha256:")).read_text())  # type: ignore[no-any-return]

    index = doc(json.loads((layout / "index.json").read_text())["manifests"][0]["digest"])
    runnable = next(doc(m["digest"]) for m in index["manifests"]
                    if m.get("platform", {}).get("os") == "linux")
    base = {layer["digest"].removeprefix("sha256:") for layer in runnable["layers"][:-1]}
    return {p.name: p.stat().st_size for p in blobs.iterdir() if p.name not in base}


def test_layouts_of_an_unchanged_container_share_their_packs(
        gen_nodes: tuple[Node, Node], tmp_path: Path, test_image: dict[str, object]) -> None:
    """Two standalone layouts (`-o DIR --oci`, no previous generation) of an idle container:
    packs are cut by content, so the second shares nearly all of its blob bytes with the first
    (a push to a registry holding the first sends only what changed)."""
    a, _ = gen_nodes
    name = "converge"
    with containers(a) as names:
        names.append(name)
        a.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "memhog", str(MEMORY_MIB))
        wait_for(lambda: "memhog" in exec_out(a, name, "ps"), what="memhog")
        time.sleep(1)  # filled
        layouts = [tmp_path / "one", tmp_path / "two"]
        for layout in layouts:
            run_torpor(a, "checkpoint", name, "-o", str(layout), "--oci", "-R")
    first, second = own_blobs(layouts[0]), own_blobs(layouts[1])
    shared = sum(size for digest, size in second.items() if digest in first)
    total = sum(second.values())
    assert total > MEMORY_MIB << 20
    assert shared >= 0.9 * total, (shared, total, len(first), len(second))
