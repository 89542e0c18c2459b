"""Push an OCI layout to a real docker-registry and pull it back: bytes, digests, media types survive."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import stat
from pathlib import Path

import pytest

from torpor.errors import IncompatibleNode
from torpor.registry import Layer, fetch_metadata, pull, push_layout

from ..support.checkpoint_layouts import (
    CHECKPOINT_ARTIFACT,
    CHECKPOINT_CONFIG,
    UNKNOWN_LAYER,
    WrittenLayout,
    write_checkpoint_layout,
)
from ..support.registry import Registry
from .conftest import FAST

pytestmark = pytest.mark.real


def configs(layout: WrittenLayout) -> set[str]:
    """Digests of every config: pull reads them in its first phase, outside the progress bar."""
    found = set()
    for body in layout.manifests.values():
        config = json.loads(body).get("config")
        if config:
            found.add(config["digest"])
    return found


def blob_file(root: Path, digest: str) -> Path:
    return root / "blobs" / "sha256" / digest.split(":")[1]


def test_push_then_pull_is_byte_identical(plain_registry: Registry, layout: WrittenLayout,
                                          tmp_path: Path) -> None:
    ref = f"{plain_registry.host}/team/web1:ckpt-1"
    progress: list[tuple[int, int]] = []
    pushed = push_layout(layout.root, ref, options=FAST,
                         progress=lambda done, total: progress.append((done, total)))

    assert pushed.digest == layout.top["digest"]
    assert pushed.uploaded == len(layout.blobs) and pushed.existing == 0 and pushed.mounted == 0
    assert pushed.bytes_uploaded == sum(layout.blobs.values())
    assert progress[-1] == (sum(layout.blobs.values()), sum(layout.blobs.values()))
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(progress))

    out = tmp_path / "pulled"
    pulled_progress: list[tuple[int, int]] = []
    pulled = pull(ref, out, options=dataclasses.replace(FAST, fsync_blobs=True),
                  progress=lambda done, total: pulled_progress.append((done, total)))
    assert pulled.digest == pushed.digest
    assert pulled_progress[-1][0] == pulled_progress[-1][1] == sum(
        size for digest, size in layout.blobs.items() if digest not in configs(layout))
    for digest, body in layout.manifests.items():
        assert blob_file(out, digest).read_bytes() == body, f"manifest {digest} changed"
    for digest in layout.blobs:
        assert blob_file(out, digest).read_bytes() == blob_file(layout.root, digest).read_bytes()
    assert sorted(p.name for p in (out / "blobs" / "sha256").iterdir()) == sorted(
        d.split(":")[1] for d in [*layout.manifests, *layout.blobs])
    index = json.loads((out / "index.json").read_text())
    assert index["manifests"][0]["digest"] == pushed.digest
    assert index["manifests"][0]["artifactType"] == CHECKPOINT_ARTIFACT
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == "ckpt-1"
    assert (out / "oci-layout").exists()
    for path in [out, *out.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path} is {oct(mode)}"


def test_pull_by_digest_and_push_again_uploads_nothing(plain_registry: Registry, layout: WrittenLayout,
                                                       tmp_path: Path) -> None:
    ref = f"{plain_registry.host}/team/web1:ckpt-1"
    first = push_layout(layout.root, ref, options=FAST)
    again = push_layout(layout.root, ref, options=FAST)
    assert again.digest == first.digest
    assert (again.uploaded, again.existing, again.bytes_uploaded) == (0, len(layout.blobs), 0)
    pulled = pull(f"{plain_registry.host}/team/web1@{first.digest}", tmp_path / "by-digest", options=FAST)
    assert pulled.digest == first.digest
    assert "org.opencontainers.image.ref.name" not in json.dumps(
        json.loads((tmp_path / "by-digest" / "index.json").read_text()))


def test_metadata_first_then_only_chosen_layers(plain_registry: Registry, layout: WrittenLayout,
                                                tmp_path: Path) -> None:
    ref = f"{plain_registry.host}/team/web1:ckpt-1"
    push_layout(layout.root, ref, options=FAST)
    out = tmp_path / "state-only"
    with fetch_metadata(ref, FAST) as plan:
        assert not out.exists(), "phase 1 must not write anything"
        assert plan.top.descriptor.digest == layout.top["digest"]
        assert plan.top.artifact_type == CHECKPOINT_ARTIFACT
        state = next(m for m in plan.manifests if m.artifact_type == CHECKPOINT_ARTIFACT and m.parent)
        assert state.contents.config is not None
        assert state.contents.config.media_type == CHECKPOINT_CONFIG
        assert state.config is not None and json.loads(state.config)["criu"] == "4.2"
        assert {m.descriptor.digest for m in plan.manifests} == set(layout.manifests)
        wanted = [layer for layer in plan.layers if layer.manifest is state]
        result = plan.download(out, wanted)
    assert {d.digest for d in result.skipped} == set(layout.image_layers) | {
        layer.descriptor.digest for layer in plan.layers if layer.manifest is not state}
    for digest in layout.state_layers:
        assert blob_file(out, digest).exists()
    for digest in layout.image_layers:
        assert not blob_file(out, digest).exists()
    unknown = next(d for d in state.contents.layers if d.media_type == UNKNOWN_LAYER)
    assert blob_file(out, unknown.digest).read_bytes() == blob_file(layout.root, unknown.digest).read_bytes()


def test_want_may_refuse_before_anything_is_written(plain_registry: Registry, layout: WrittenLayout,
                                                    tmp_path: Path) -> None:
    ref = f"{plain_registry.host}/team/web1:ckpt-1"
    push_layout(layout.root, ref, options=FAST)
    seen: list[Layer] = []

    def incompatible(layer: Layer) -> bool:
        seen.append(layer)
        raise IncompatibleNode(["kernel 5.4 is older than the checkpoint's 6.1"])

    with pytest.raises(IncompatibleNode):
        pull(ref, tmp_path / "never", want=incompatible, options=FAST)
    assert seen and not (tmp_path / "never").exists()


def test_cross_repository_mount(plain_registry: Registry, layout: WrittenLayout, tmp_path: Path) -> None:
    push_layout(layout.root, f"{plain_registry.host}/team/base:1", options=FAST)
    mounted = push_layout(layout.root, f"{plain_registry.host}/team/copy:1", options=FAST,
                          mount_from=["team/nothing-here", "team/base"])
    assert (mounted.mounted, mounted.uploaded, mounted.bytes_uploaded) == (len(layout.blobs), 0, 0)
    other = write_checkpoint_layout(tmp_path / "other", seed=7)
    fallback = push_layout(other.root, f"{plain_registry.host}/team/other:1", options=FAST,
                           mount_from=["team/base"])
    new_blobs = set(other.blobs) - set(layout.blobs)
    assert fallback.uploaded == len(new_blobs) and fallback.mounted == len(other.blobs) - len(new_blobs)
    pull(f"{plain_registry.host}/team/copy:1", tmp_path / "copy", options=FAST)


def test_layout_with_several_entries_pushes_the_named_one(plain_registry: Registry,
                                                          layout: WrittenLayout) -> None:
    index_file = layout.root / "index.json"
    index = json.loads(index_file.read_text())
    image = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": layout.image_manifest,
             "size": len(layout.manifests[layout.image_manifest]),
             "annotations": {"org.opencontainers.image.ref.name": "runnable"}}
    index["manifests"].append(image)
    index_file.write_text(json.dumps(index))
    assert push_layout(layout.root, f"{plain_registry.host}/team/web1:runnable",
                       options=FAST).digest == layout.image_manifest
    assert push_layout(layout.root, f"{plain_registry.host}/team/web1:ckpt-1",
                       options=FAST).digest == layout.top["digest"]
    whole = push_layout(layout.root, f"{plain_registry.host}/team/web1:other", options=FAST)
    assert whole.media_type == "application/vnd.oci.image.index.v1+json"
    assert whole.digest == "sha256:" + hashlib.sha256(index_file.read_bytes()).hexdigest()


def test_blobs_already_in_the_target_layout_are_kept(plain_registry: Registry, layout: WrittenLayout,
                                                     tmp_path: Path) -> None:
    ref = f"{plain_registry.host}/team/web1:ckpt-1"
    push_layout(layout.root, ref, options=FAST)
    out = tmp_path / "twice"
    pull(ref, out, options=FAST)
    big = max(layout.state_layers, key=lambda d: layout.blobs.get(d, 0))
    inode = os.stat(blob_file(out, big)).st_ino
    second = pull(ref, out, options=FAST)
    configs = 3  # image, state and empty configs: fetched again in phase 1; the layers are not
    assert second.downloaded == configs and os.stat(blob_file(out, big)).st_ino == inode


def test_docker_v2_manifest_list(plain_registry: Registry, tmp_path: Path) -> None:
    """Docker's schema 2 types go out and come back with their own Content-Type, bytes unchanged."""
    root = tmp_path / "docker-layout"
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        (blobs / digest.split(":")[1]).write_bytes(data)
        return {"digest": digest, "size": len(data)}

    config = put(b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}')
    layer = put(b"\x1f\x8b" + bytes(100))
    manifest_body = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", **layer}]}).encode()
    manifest = put(manifest_body)
    list_body = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
        "manifests": [{"mediaType": "application/vnd.docker.distribution.manifest.v2+json", **manifest,
                       "platform": {"architecture": "amd64", "os": "linux"}}]}).encode()
    top = put(list_body)
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.docker.distribution.manifest.list.v2+json", **top}]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')

    ref = f"{plain_registry.host}/team/docker:1"
    pushed = push_layout(root, ref, options=FAST)
    assert pushed.digest == top["digest"]
    pulled = pull(ref, tmp_path / "out", options=FAST)
    assert pulled.media_type == "application/vnd.docker.distribution.manifest.list.v2+json"
    assert blob_file(tmp_path / "out", str(top["digest"])).read_bytes() == list_body
    assert blob_file(tmp_path / "out", str(manifest["digest"])).read_bytes() == manifest_body
