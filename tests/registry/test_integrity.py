"""A registry that serves the wrong bytes: every case is a clear error and leaves nothing behind.

The tests tamper with docker-registry's own storage (docker/registry/v2/blobs/.../data), which it
serves without checking, the way a damaged disk or a hostile mirror would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from torpor.errors import DigestMismatch, ImageError, RegistryError
from torpor.formats.oci import Descriptor
from torpor.registry import EarlyBlobs, fetch_metadata, pull, push_layout

from ..support.checkpoint_layouts import WrittenLayout
from ..support.registry import Registry
from .conftest import FAST

pytestmark = pytest.mark.real


@pytest.fixture
def pushed(plain_registry: Registry, layout: WrittenLayout) -> str:
    ref = f"{plain_registry.host}/team/web1:ckpt-1"
    push_layout(layout.root, ref, options=FAST)
    return ref


def largest_state_layer(layout: WrittenLayout) -> str:
    return max(layout.state_layers, key=lambda d: layout.blobs[d])


def assert_nothing_left(target: Path) -> None:
    assert not target.exists(), f"left behind: {sorted(str(p) for p in target.rglob('*'))}"


def test_blob_with_other_content_is_a_digest_mismatch(plain_registry: Registry, layout: WrittenLayout,
                                                      pushed: str, tmp_path: Path) -> None:
    victim = largest_state_layer(layout)
    data = plain_registry.blob_data(victim)
    content = bytearray(data.read_bytes())
    content[len(content) // 2] ^= 0xFF  # same size, one byte flipped
    data.write_bytes(bytes(content))
    with pytest.raises(DigestMismatch) as raised:
        pull(pushed, tmp_path / "out", options=FAST)
    assert victim in str(raised.value) and "team/web1" in str(raised.value)
    assert_nothing_left(tmp_path / "out")


def test_truncated_layer(plain_registry: Registry, layout: WrittenLayout, pushed: str,
                         tmp_path: Path) -> None:
    victim = largest_state_layer(layout)
    data = plain_registry.blob_data(victim)
    os.truncate(data, layout.blobs[victim] // 3)
    with pytest.raises(ImageError, match="truncated") as raised:
        pull(pushed, tmp_path / "out", options=FAST)
    assert victim in str(raised.value) and f"of {layout.blobs[victim]} bytes" in str(raised.value)
    assert_nothing_left(tmp_path / "out")


def test_missing_layer(plain_registry: Registry, layout: WrittenLayout, pushed: str, tmp_path: Path) -> None:
    victim = largest_state_layer(layout)
    shutil.rmtree(plain_registry.blob_data(victim).parent)
    with pytest.raises(RegistryError) as raised:
        pull(pushed, tmp_path / "out", options=FAST)
    message = str(raised.value)
    assert raised.value.status == 404 and victim in message and "BLOB_UNKNOWN" in message
    assert_nothing_left(tmp_path / "out")


def test_existing_layout_keeps_what_it_had(plain_registry: Registry, layout: WrittenLayout, pushed: str,
                                           tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep-me").write_text("the caller's")
    victim = largest_state_layer(layout)
    os.truncate(plain_registry.blob_data(victim), 10)
    with pytest.raises(ImageError):
        pull(pushed, out, options=FAST)
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["keep-me"]


def test_manifest_over_4_mib(plain_registry: Registry, layout: WrittenLayout, pushed: str,
                             tmp_path: Path) -> None:
    top = str(layout.top["digest"])
    document = json.loads(layout.manifests[top])
    document["annotations"]["padding"] = "x" * (5 << 20)
    plain_registry.blob_data(top).write_bytes(json.dumps(document).encode())
    # distribution 2.8 itself refuses to read a manifest over 4 MiB from its storage ("storage:
    # read exceeds limit" in its log, an empty detail on the wire); the client's own limit is
    # exercised below, with a smaller limit
    with pytest.raises(RegistryError, match="answered 500 to GET manifest team/web1:ckpt-1") as raised:
        pull(pushed, tmp_path / "out", options=FAST)
    assert raised.value.status == 500
    assert_nothing_left(tmp_path / "out")


def test_manifest_over_the_client_limit(plain_registry: Registry, layout: WrittenLayout, pushed: str,
                                        tmp_path: Path) -> None:
    top = str(layout.top["digest"])
    document = json.loads(layout.manifests[top])
    document["annotations"]["padding"] = "x" * (1 << 20)
    plain_registry.blob_data(top).write_bytes(json.dumps(document).encode())
    small_limit = dataclasses.replace(FAST, manifest_limit=64 << 10)
    with pytest.raises(RegistryError, match="team/web1:ckpt-1 is larger than the limit of 65536 bytes"):
        pull(pushed, tmp_path / "out", options=small_limit)
    assert_nothing_left(tmp_path / "out")


def test_child_manifest_with_other_content(plain_registry: Registry, layout: WrittenLayout, pushed: str,
                                           tmp_path: Path) -> None:
    state = layout.state_manifest
    body = layout.manifests[state].replace(b"torpor checkpoint state", b"torpor checkpoint STATE")
    plain_registry.blob_data(state).write_bytes(body)
    with pytest.raises(DigestMismatch, match=state), fetch_metadata(pushed, FAST):
        pass
    assert_nothing_left(tmp_path / "out")


def test_layout_blob_that_does_not_match_is_not_pushed(plain_registry: Registry,
                                                       layout: WrittenLayout) -> None:
    victim = largest_state_layer(layout)
    path = layout.root / "blobs" / "sha256" / victim.split(":")[1]
    content = bytearray(path.read_bytes())
    content[0] ^= 0xFF
    path.write_bytes(bytes(content))
    with pytest.raises(DigestMismatch, match=victim):
        push_layout(layout.root, f"{plain_registry.host}/team/bad:1", options=FAST)
    assert not plain_registry.blob_data(victim).exists()


@pytest.mark.parametrize("chunk_size", [None, 64 << 10], ids=["monolithic", "chunked"])
def test_a_blob_written_here_that_changed_on_disk_is_refused_by_the_registry(
        plain_registry: Registry, layout: WrittenLayout, chunk_size: int | None) -> None:
    """A checkpoint's own layers and packs go up unhashed (their digests were computed as they
    were written): if the file no longer matches, the registry's own check refuses it, the
    upload fails naming the file, and the registry holds nothing under that digest."""
    victim = largest_state_layer(layout)
    path = layout.root / "blobs" / "sha256" / victim.split(":")[1]
    content = bytearray(path.read_bytes())
    assert len(content) > 2 * (64 << 10)
    content[len(content) // 2] ^= 0xFF
    path.write_bytes(bytes(content))
    options = FAST if chunk_size is None else dataclasses.replace(FAST, chunk_size=chunk_size)
    with pytest.raises(DigestMismatch, match=re.escape(f"{victim} ({path}) changed after torpor wrote it")), \
            EarlyBlobs(f"{plain_registry.host}/team/early:1", options) as early:
        early.submit(path, Descriptor("application/octet-stream", victim, len(content)),
                     written_here=True)
    assert not plain_registry.blob_data(victim).exists()


def test_layout_missing_a_blob_fails_before_any_upload(plain_registry: Registry,
                                                       layout: WrittenLayout) -> None:
    victim = largest_state_layer(layout)
    (layout.root / "blobs" / "sha256" / victim.split(":")[1]).unlink()
    with pytest.raises(ImageError, match=f"{victim}.*missing from the layout"):
        push_layout(layout.root, f"{plain_registry.host}/team/bad:1", options=FAST)
    assert not (plain_registry.storage / "docker").exists()
