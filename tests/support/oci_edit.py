"""Editing a checkpoint image's OCI layout the way an attacker or a bug would: new metadata,
extra or odd layers. Digests are recomputed so that only the change under test is wrong."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zstandard


def _put(layout: Path, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest.split(":")[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def _get(layout: Path, digest: str) -> dict[str, Any]:
    return json.loads((layout / "blobs" / "sha256" / digest.split(":")[1]).read_bytes())


def blob(layout: Path, media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": _put(layout, data), "size": len(data), **extra}


def tar_zstd(entries: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info in entries:
            body = (data or {}).get(info.name)
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return zstandard.ZstdCompressor().compress(raw.getvalue())


Edit = Callable[[dict[str, Any], dict[str, Any], Path], None]


def edit(layout: Path, change: Edit) -> str:
    """Apply `change(state_manifest, metadata, layout)` and rewrite the digests above it.
    Returns the new index digest (index.json points at it)."""
    index_json = json.loads((layout / "index.json").read_text())
    top = index_json["manifests"][0]
    index = _get(layout, top["digest"])
    state_entry = next(m for m in index["manifests"]
                       if m.get("artifactType") == "application/vnd.torpor.checkpoint.v1")
    state = _get(layout, state_entry["digest"])
    metadata = _get(layout, state["config"]["digest"])
    change(state, metadata, layout)
    config = json.dumps(metadata).encode()
    state["config"] = {**state["config"], "digest": _put(layout, config), "size": len(config)}
    state_bytes = json.dumps(state).encode()
    state_entry.update(digest=_put(layout, state_bytes), size=len(state_bytes))
    index_bytes = json.dumps(index).encode()
    top.update(digest=_put(layout, index_bytes), size=len(index_bytes))
    (layout / "index.json").write_text(json.dumps(index_json))
    return str(top["digest"])
