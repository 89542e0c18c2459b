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
    run_doc = documents.runnable_manifest(blob(run_config), [], created, "base", "d", cid)
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
