"""What torpor pushes, skopeo reads and copies; what skopeo pushes, torpor pulls (same registry).

skopeo 1.9 (Debian 12) neither copies nested indexes nor inspects non-image artifacts except
with --raw, so the copies use the checkpoint's own shape: an index of a runnable image and a
state artifact. It rewrites an index it copies (dropping artifactType), even when asked to
preserve digests (then it refuses), so only manifests are compared byte for byte.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from torpor.registry import pull, push_layout

from ..support.checkpoint_layouts import WrittenLayout, write_checkpoint_layout
from ..support.registry import Registry
from .conftest import FAST

pytestmark = pytest.mark.real


def skopeo(*args: str) -> str:
    result = subprocess.run(["skopeo", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"skopeo {' '.join(args)}: {result.stderr}"
    return result.stdout


def test_skopeo_reads_what_torpor_pushed(plain_registry: Registry, layout: WrittenLayout) -> None:
    ref = f"{plain_registry.host}/team/web1:ckpt-1"
    push_layout(layout.root, ref, options=FAST)
    raw = skopeo("inspect", "--tls-verify=false", "--raw", f"docker://{ref}")
    assert raw.encode() == layout.manifests[str(layout.top["digest"])]
    for digest, body in layout.manifests.items():
        child = skopeo("inspect", "--tls-verify=false", "--raw", f"docker://{plain_registry.host}/team/web1@{digest}")
        assert child.encode() == body
    image = json.loads(skopeo("inspect", "--tls-verify=false", f"docker://{ref}"))  # the linux/amd64 image
    assert image["Digest"] == layout.top["digest"] and image["Layers"] == layout.image_layers


def test_skopeo_copies_what_torpor_pushed(plain_registry: Registry, tmp_path: Path) -> None:
    layout = write_checkpoint_layout(tmp_path / "layout", nested=False)
    ref = f"{plain_registry.host}/team/web1:ckpt-1"
    push_layout(layout.root, ref, options=FAST)
    for digest in (layout.image_manifest, layout.state_manifest):  # each manifest, digest kept
        copied = tmp_path / f"skopeo-{digest[7:19]}"
        skopeo("copy", "--preserve-digests", "--src-tls-verify=false",
               f"docker://{plain_registry.host}/team/web1@{digest}", f"oci:{copied}:x")
        assert json.loads((copied / "index.json").read_text())["manifests"][0]["digest"] == digest
        assert blob(copied, digest) == layout.manifests[digest]
    whole = tmp_path / "skopeo-all"  # the whole index: skopeo 1.9 rewrites the index itself
    skopeo("copy", "--all", "--src-tls-verify=false", f"docker://{ref}", f"oci:{whole}:ckpt-1")
    for digest in [layout.image_manifest, layout.state_manifest, *layout.blobs]:
        assert blob(whole, digest) == blob(layout.root, digest)


def test_torpor_pulls_what_skopeo_pushed(plain_registry: Registry, tmp_path: Path) -> None:
    layout = write_checkpoint_layout(tmp_path / "layout", nested=False)
    ref = f"{plain_registry.host}/team/from-skopeo:1"
    skopeo("copy", "--all", "--dest-tls-verify=false", f"oci:{layout.root}:ckpt-1", f"docker://{ref}")
    registry_index = skopeo("inspect", "--tls-verify=false", "--raw", f"docker://{ref}").encode()
    out = tmp_path / "pulled"
    pulled = pull(ref, out, options=FAST)
    assert blob(out, pulled.digest) == registry_index
    for digest in [layout.image_manifest, layout.state_manifest, *layout.blobs]:
        assert blob(out, digest) == blob(layout.root, digest)


def blob(root: Path, digest: str) -> bytes:
    return (root / "blobs" / "sha256" / digest.split(":")[1]).read_bytes()
