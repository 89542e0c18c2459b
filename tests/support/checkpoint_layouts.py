"""OCI image-layout directories shaped like torpor's checkpoint images, for registry tests and benches.

`write_checkpoint_layout` writes an index (with artifactType and annotations) naming:
  - a runnable image manifest (linux/amd64, image config, a tar+gzip layer),
  - a state manifest (platform unknown/unknown, artifactType application/vnd.torpor.checkpoint.v1,
    a custom config type, custom and unknown layer media types),
  - a nested index naming one more artifact manifest whose config is the empty descriptor.
Manifests are serialised with indentation and odd key order on purpose: a registry client that
re-serialises them changes their digests, and the tests would see it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CHECKPOINT_ARTIFACT = "application/vnd.torpor.checkpoint.v1"
CHECKPOINT_CONFIG = "application/vnd.torpor.checkpoint.config.v1+json"
CRIU_LAYER = "application/vnd.torpor.criu.images.v1.tar+zstd"
UNKNOWN_LAYER = "application/vnd.example.never-heard-of-it"
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
NOTE_ARTIFACT = "application/vnd.example.note"


@dataclass
class WrittenLayout:
    root: Path
    top: dict[str, object]  # descriptor of the top index
    manifests: dict[str, bytes] = field(default_factory=dict)  # digest -> bytes, every manifest
    blobs: dict[str, int] = field(default_factory=dict)  # digest -> size, configs and layers
    image_manifest: str = ""
    state_manifest: str = ""
    state_layers: list[str] = field(default_factory=list)
    image_layers: list[str] = field(default_factory=list)


class _Writer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.blob_dir = root / "blobs" / "sha256"
        self.blob_dir.mkdir(parents=True, exist_ok=True)

    def put(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        (self.blob_dir / digest[7:]).write_bytes(data)
        return digest

    def put_random(self, size: int, seed: int) -> str:
        """`size` bytes of incompressible content, streamed to disk a MiB at a time."""
        hasher, temporary = hashlib.sha256(), self.blob_dir / f".random-{seed}"
        with open(temporary, "wb") as out:
            left = size
            while left:
                piece = os.urandom(min(left, 1 << 20))
                out.write(piece)
                hasher.update(piece)
                left -= len(piece)
        digest = "sha256:" + hasher.hexdigest()
        temporary.rename(self.blob_dir / digest[7:])
        return digest


def descriptor(media_type: str, digest: str, size: int, **extra: object) -> dict[str, object]:
    return {"mediaType": media_type, "digest": digest, "size": size, **extra}


def _tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue(), mtime=0)


def _manifest_bytes(document: dict[str, object]) -> bytes:
    return json.dumps(document, indent=3).encode() + b"\n"


def write_checkpoint_layout(root: Path, *, state_layer_sizes: tuple[int, ...] = (300_000, 1_000_000),
                            tag: str = "ckpt-1", seed: int = 0, nested: bool = True) -> WrittenLayout:
    w = _Writer(root)
    out = WrittenLayout(root, {})

    def add_blob(data: bytes) -> tuple[str, int]:
        digest = w.put(data)
        out.blobs[digest] = len(data)
        return digest, len(data)

    def add_manifest(document: dict[str, object], media_type: str, **extra: object) -> dict[str, object]:
        body = _manifest_bytes(document)
        digest = w.put(body)
        out.manifests[digest] = body
        return descriptor(media_type, digest, len(body), **extra)

    layer, layer_size = add_blob(_tar_gz({"etc/hostname": b"web1\n", f"seed-{seed}": b"x"}))
    image_config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["sh"]},
                               "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "0" * 64]}}).encode()
    config, config_size = add_blob(image_config)
    image = add_manifest({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                          "config": descriptor(IMAGE_CONFIG, config, config_size),
                          "layers": [descriptor(GZIP_LAYER, layer, layer_size)]},
                         OCI_MANIFEST, platform={"architecture": "amd64", "os": "linux"})
    out.image_manifest, out.image_layers = str(image["digest"]), [layer]

    state_config, state_config_size = add_blob(json.dumps(
        {"node": {"arch": "amd64", "kernel": "6.1"}, "criu": "4.2", "seed": seed}).encode())
    state_layers = []
    for i, size in enumerate(state_layer_sizes):
        digest = w.put_random(size, seed * 100 + i)
        out.blobs[digest] = size
        state_layers.append(descriptor(CRIU_LAYER, digest, size,
                                       annotations={"org.opencontainers.image.title": f"pages-{i}.tar.zst"}))
    unknown, unknown_size = add_blob(b"opaque bytes of a type nobody knows\x00\x01\x02" * 10)
    state_layers.append(descriptor(UNKNOWN_LAYER, unknown, unknown_size))
    state = add_manifest({"layers": state_layers, "schemaVersion": 2, "mediaType": OCI_MANIFEST,
                          "artifactType": CHECKPOINT_ARTIFACT,
                          "config": descriptor(CHECKPOINT_CONFIG, state_config, state_config_size),
                          "annotations": {"org.opencontainers.image.description": "torpor checkpoint state"}},
                         OCI_MANIFEST, artifactType=CHECKPOINT_ARTIFACT,
                         platform={"architecture": "unknown", "os": "unknown"})
    out.state_manifest = str(state["digest"])
    out.state_layers = [str(d["digest"]) for d in state_layers]

    children = [image, state]
    if nested:
        children.append(_nested_index(add_blob, add_manifest, seed))
    out.top = add_manifest({"schemaVersion": 2, "mediaType": OCI_INDEX, "artifactType": CHECKPOINT_ARTIFACT,
                            "manifests": children,
                            "annotations": {"org.opencontainers.image.ref.name": tag}}, OCI_INDEX)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX,
             "manifests": [{**out.top, "annotations": {"org.opencontainers.image.ref.name": tag}}]}
    (root / "index.json").write_text(json.dumps(index))
    (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return out


def _nested_index(add_blob: Callable[[bytes], tuple[str, int]],
                  add_manifest: Callable[..., dict[str, object]], seed: int) -> dict[str, object]:
    """An index naming one artifact manifest whose config is the empty descriptor."""
    empty, empty_size = add_blob(b"{}")
    note, note_size = add_blob(f"attached note {seed}".encode())
    attached = add_manifest({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": NOTE_ARTIFACT,
                             "config": descriptor(EMPTY_CONFIG, empty, empty_size),
                             "layers": [descriptor("text/plain", note, note_size)]},
                            OCI_MANIFEST, artifactType=NOTE_ARTIFACT)
    return add_manifest({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [attached]}, OCI_INDEX)


def write_single_blob_layout(root: Path, size: int, seed: int = 1) -> WrittenLayout:
    """A layout whose one artifact manifest has one large random layer (streaming tests)."""
    w = _Writer(root)
    out = WrittenLayout(root, {})
    layer = w.put_random(size, seed)
    empty = w.put(b"{}")
    body = _manifest_bytes({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                            "artifactType": CHECKPOINT_ARTIFACT, "config": descriptor(EMPTY_CONFIG, empty, 2),
                            "layers": [descriptor(CRIU_LAYER, layer, size)]})
    digest = w.put(body)
    out.top = descriptor(OCI_MANIFEST, digest, len(body))
    out.manifests[digest] = body
    out.blobs = {layer: size, empty: 2}
    out.state_layers = [layer]
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [out.top]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return out
