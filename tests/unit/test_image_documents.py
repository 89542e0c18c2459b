"""Layer planning and the checkpoint image's documents, checked by the reader that restores them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from torpor.errors import ImageError
from torpor.formats import mediatypes as mt
from torpor.formats.oci import Descriptor
from torpor.image import documents, extract, layers, unpack

from .samples import METADATA


def blob(document: dict) -> Descriptor:  # type: ignore[type-arg]
    data = documents.canonical(document)
    return Descriptor(document.get("mediaType", mt.OCI_CONFIG),
                      "sha256:" + hashlib.sha256(data).hexdigest(), len(data))


def test_pieces_and_groups(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 2500)
    (tmp_path / "small").write_bytes(b"y" * 100)
    pieces = layers.pieces_of(str(tmp_path), ["big", "small"], 1000)
    assert [(p.name, p.offset, p.length) for p in pieces] == [
        ("big", 0, 1000), ("big", 1000, 1000), ("big", 2000, 500), ("small", 0, 100)]
    assert [[p.length for p in g] for g in layers.group(pieces, 1500)] == [
        [1000], [1000, 500], [100]]


def test_a_layer_of_pieces_extracts_to_the_same_files(tmp_path: Path) -> None:
    source = tmp_path / "src" / "criu"
    source.mkdir(parents=True)
    (source / "pages-1.img").write_bytes(bytes(range(256)) * 40)
    pieces = layers.pieces_of(str(tmp_path / "src"), ["criu/pages-1.img"], 4096)
    written = [layers.write_layer(g, str(tmp_path / f"l{i}.tar.zst"))
               for i, g in enumerate(layers.group(pieces, 4096))]
    out = tmp_path / "out"
    out.mkdir()
    for layer in reversed(written):  # parts land at their offsets, in any order
        extract.extract_layer(layer.path, layer.digest, layer.size, str(out), ("criu",), "layer")
    assert (out / "criu" / "pages-1.img").read_bytes() == (source / "pages-1.img").read_bytes()


def test_the_index_the_builder_makes_is_what_a_restore_accepts() -> None:
    created, cid = "2026-12-01T00:00:00Z", "web1"
    config = blob({"checkpoint": True})
    config = Descriptor(mt.CHECKPOINT_CONFIG, config.digest, config.size)
    criu = Descriptor(mt.CRIU_LAYER, "sha256:" + "3" * 64, 10)
    state_doc = documents.state_manifest(config, [criu], created, cid)
    state = blob(state_doc)
    state = Descriptor(state.media_type, state.digest, state.size,
                       {**state.to_json(), **documents.state_entry()})
    run_config = documents.runnable_config({"architecture": "amd64", "os": "linux",
                                            "rootfs": {"type": "layers", "diff_ids": ["a"]}},
                                           "b", created, cid)
    assert run_config["rootfs"]["diff_ids"] == ["a", "b"]
    base_layers = [layer.to_json() for layer in METADATA.image.layers] if METADATA.image else []
    run_doc = documents.runnable_manifest(blob(run_config), base_layers, created, "base", "d", cid)
    runnable = blob(run_doc)
    runnable = Descriptor(runnable.media_type, runnable.digest, runnable.size,
                          {**runnable.to_json(), **documents.runnable_entry(run_config)})
    index = documents.index(runnable, state, created, cid, "base")
    manifests = {state.digest: (state, state_doc), runnable.digest: (runnable, run_doc)}
    image = unpack.assemble(blob(index), index, manifests, METADATA.dumps())
    assert image.state.digest == state.digest and image.runnable.digest == runnable.digest
    assert image.metadata == METADATA
    state_doc["layers"][0]["mediaType"] = "application/vnd.example.unknown"
    with pytest.raises(ImageError, match="unknown media type"):
        unpack.assemble(blob(index), index, manifests, METADATA.dumps())


def documents_with(state_layers: list[Descriptor], own: list[Descriptor], metadata: bytes,
                   ) -> tuple[Descriptor, dict, dict]:  # type: ignore[type-arg]
    created, cid = "2026-12-01T00:00:00Z", "web1"
    config = Descriptor(mt.CHECKPOINT_CONFIG, blob({"c": 1}).digest, 10)
    state_doc = documents.state_manifest(config, state_layers, created, cid)
    state = blob(state_doc)
    state = Descriptor(state.media_type, state.digest, state.size,
                       {**state.to_json(), **documents.state_entry()})
    run_config = {"architecture": "amd64", "os": "linux"}
    base = [layer.to_json() for layer in METADATA.image.layers] if METADATA.image else []
    run_doc = documents.runnable_manifest(blob(run_config), [*base, *(d.to_json() for d in own)],
                                          created, "base", "d", cid)
    runnable = blob(run_doc)
    runnable = Descriptor(runnable.media_type, runnable.digest, runnable.size,
                          {**runnable.to_json(), **documents.runnable_entry(run_config)})
    index = documents.index(runnable, state, created, cid, "base")
    return blob(index), index, {state.digest: (state, state_doc),
                                runnable.digest: (runnable, run_doc)}


def test_limits_are_checked_before_any_layer_is_read() -> None:
    from dataclasses import replace

    from torpor.formats.files import FileEntry

    criu = Descriptor(mt.CRIU_LAYER, "sha256:" + "3" * 64, 1000)
    desc, index, manifests = documents_with([criu] * 3, [], METADATA.dumps())
    with pytest.raises(ImageError, match="4 layers, more than the limit of 3"):
        unpack.assemble(desc, index, manifests, METADATA.dumps(), unpack.ImageLimits(max_layers=3))
    bomb = replace(METADATA, files=(FileEntry("criu/pages-1.img", 4 << 30),))
    with pytest.raises(ImageError, match="decompression bomb"):
        unpack.assemble(desc, index, manifests, bomb.dumps())
    with pytest.raises(ImageError, match="max_unpacked_bytes"):
        unpack.assemble(desc, index, manifests, bomb.dumps(),
                        unpack.ImageLimits(max_unpacked_bytes=1 << 30))
    escape = replace(METADATA, files=(FileEntry("../../etc/shadow", 1),))
    with pytest.raises(ImageError, match="unsafe path"):
        unpack.assemble(desc, index, manifests, escape.dumps())
    swapped = [Descriptor(mt.OCI_LAYER_ZSTD, "sha256:" + "4" * 64, 5)]
    _, run_doc = next((d, doc) for d, doc in manifests.values() if "config" in doc
                      and doc["config"]["mediaType"] == mt.OCI_CONFIG)
    run_doc["layers"] = [d.to_json() for d in swapped]
    with pytest.raises(ImageError, match="not the base image's"):
        unpack.assemble(desc, index, manifests, METADATA.dumps())


def test_an_encrypted_image_keeps_only_what_a_preflight_needs_in_the_clear() -> None:
    from torpor.image import clear_metadata

    clear = clear_metadata.redact(METADATA)
    assert clear.container.spec == {} and clear.container.labels == {}
    assert clear.state.processes == () and clear.state.network.sockets == ()
    assert all(v.source == "" for v in clear.state.files.volumes)
    assert (clear.node, clear.state.gpu, clear.files, clear.image, clear.sizes) == (
        METADATA.node, METADATA.state.gpu, METADATA.files, METADATA.image, METADATA.sizes)
    enc = "+encrypted"
    layers = [Descriptor(mt.METADATA_LAYER + enc, "sha256:" + "5" * 64, 100),
              Descriptor(mt.CRIU_LAYER + enc, "sha256:" + "3" * 64, 1 << 20)]
    own = [Descriptor(mt.OCI_LAYER_ZSTD + enc, "sha256:" + "6" * 64, 10)]
    desc, index, manifests = documents_with(layers, own, clear.dumps())
    image = unpack.assemble(desc, index, manifests, clear.dumps())
    assert image.encrypted and image.metadata_layer == layers[0]
    assert image.payload_layers == layers[1:] and image.own_layers == own
