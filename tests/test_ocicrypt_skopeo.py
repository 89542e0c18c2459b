"""ocicrypt interop with the real skopeo, both ways, on OCI image layouts of two layers
(tar+gzip and tar+zstd):
  - `skopeo copy --encryption-key jwe:PUB.pem` encrypts, torpor decrypts every layer back to the
    original blobs;
  - torpor encrypts every layer (the manifest rewritten with the new descriptors), `skopeo copy
    --decryption-key KEY.pem` decrypts it to a layout whose layers are the original blobs;
for RSA 2048 and 4096 and EC P-256, P-384 and P-521 keys, and several recipients at once.
skopeo refuses to encrypt layers of media types it does not know (torpor's own state layers:
"encryption specified but no counterpart for mediatype"), but decrypts them, a whole checkpoint
layout at once with --all: that way is tested.
Keys are made with openssl as a user would; EC private keys are PKCS#8, the only EC form that
skopeo 1.9 (ocicrypt 1.0.3) reads.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import zstandard

from torpor.formats.oci import Descriptor
from torpor.image import ocicrypt
from torpor.image.encryption_keys import load_decryption_key, parse_recipient
from torpor.registry.layout import Layout

from .support.checkpoint_layouts import CRIU_LAYER, UNKNOWN_LAYER, write_checkpoint_layout

TAG = "v1"
GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"
KEY_KINDS = {"rsa2048": ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
             "rsa4096": ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:4096"],
             "ec-p256": ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
             "ec-p384": ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
             "ec-p521": ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-521"]}


def run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(argv)}: {result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """KIND.pem (private, PKCS#8) and KIND.pub (SubjectPublicKeyInfo) for each kind."""
    directory = tmp_path_factory.mktemp("keys")
    for kind, options in KEY_KINDS.items():
        run("openssl", "genpkey", *options, "-out", str(directory / f"{kind}.pem"))
        run("openssl", "pkey", "-in", str(directory / f"{kind}.pem"), "-pubout",
            "-out", str(directory / f"{kind}.pub"))
    return directory


def tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def put(layout: Layout, data: bytes, media_type: str) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    layout.write_small(digest, data, durable=False)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def write_manifest(layout: Layout, config: dict[str, Any], layers: list[dict[str, Any]]) -> None:
    body = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": config, "layers": layers}).encode()
    manifest = put(layout, body, "application/vnd.oci.image.manifest.v1+json")
    layout.tag(Descriptor.from_json(manifest, "manifest"), TAG)


def write_plain_layout(root: Path) -> list[dict[str, Any]]:
    """A layout of one image with a tar+gzip and a tar+zstd layer; its layers' descriptors."""
    layout = Layout(root)
    layout.create()
    diffs = [tar_of({"etc/hostname": b"web1\n", "data/random": hashlib.sha256(b"a").digest() * 5000}),
             tar_of({"pages-1.img": bytes(range(256)) * 4000, "core-1.img": b"registers\n"})]
    blobs = [gzip.compress(diffs[0], mtime=0), zstandard.ZstdCompressor(level=3).compress(diffs[1])]
    layers = [put(layout, blobs[0], GZIP_LAYER), put(layout, blobs[1], ZSTD_LAYER)]
    config = put(layout, json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {
        "type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(d).hexdigest() for d in diffs]}}).encode(),
        "application/vnd.oci.image.config.v1+json")
    write_manifest(layout, config, layers)
    return layers


def manifest_of(root: Path) -> dict[str, Any]:
    entry = json.loads((root / "index.json").read_text())["manifests"][0]
    value: dict[str, Any] = json.loads(Layout(root).blob_path(entry["digest"]).read_bytes())
    return value


def assert_blobs_intact(root: Path) -> None:
    """Every blob file hashes to its name (skopeo names a decrypted blob by the digest it was told)."""
    for blob in (root / "blobs" / "sha256").iterdir():
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name


def encrypt_layers(layout: Layout, manifest: dict[str, Any], recipient_specs: list[str]) -> dict[str, Any]:
    """Encrypt every layer of `manifest` in place in the layout, as a checkpoint push would; the
    rewritten manifest's descriptor."""
    recipients = [parse_recipient(spec) for spec in recipient_specs]
    layers = []
    for layer in manifest["layers"]:
        plain, staging = layout.blob_path(layer["digest"]), layout.root / "encrypting"
        result = ocicrypt.encrypt_blob(str(plain), str(staging), layer["mediaType"], recipients,
                                       durable=False)
        staging.rename(layout.blob_path(result.digest))
        plain.unlink()
        layers.append({"mediaType": result.media_type, "digest": result.digest, "size": result.size,
                       "annotations": {**layer.get("annotations", {}), **result.annotations}})
    body = json.dumps({**manifest, "layers": layers}).encode()
    return put(layout, body, manifest.get("mediaType", "application/vnd.oci.image.manifest.v1+json"))


def torpor_encrypts(src: Path, dst: Path, recipient_specs: list[str]) -> None:
    """Copy the image layout at src to dst with every layer encrypted."""
    shutil.copytree(src, dst)
    descriptor = encrypt_layers(Layout(dst), manifest_of(src), recipient_specs)
    Layout(dst).tag(Descriptor.from_json(descriptor, "manifest"), TAG)


def torpor_decrypts(root: Path, key_files: list[Path], out: Path) -> list[ocicrypt.PlainBlob]:
    keys = [load_decryption_key(str(k)) for k in key_files]
    out.mkdir()
    results = []
    for i, layer in enumerate(manifest_of(root)["layers"]):
        assert ocicrypt.is_encrypted(layer["mediaType"])
        results.append(ocicrypt.decrypt_blob(str(Layout(root).blob_path(layer["digest"])), str(out / str(i)),
                                             layer, keys))
    return results


@pytest.mark.parametrize("kind", list(KEY_KINDS))
def test_torpor_decrypts_what_skopeo_encrypted(tmp_path: Path, key_dir: Path, kind: str) -> None:
    originals = write_plain_layout(tmp_path / "plain")
    run("skopeo", "copy", "-q", "--encryption-key", f"jwe:{key_dir / kind}.pub",
        f"oci:{tmp_path / 'plain'}:{TAG}", f"oci:{tmp_path / 'encrypted'}:{TAG}")
    encrypted = manifest_of(tmp_path / "encrypted")["layers"]
    assert [layer["mediaType"] for layer in encrypted] == [GZIP_LAYER + ocicrypt.ENCRYPTED_SUFFIX,
                                                           ZSTD_LAYER + ocicrypt.ENCRYPTED_SUFFIX]
    results = torpor_decrypts(tmp_path / "encrypted", [key_dir / f"{kind}.pem"], tmp_path / "decrypted")
    assert [(r.media_type, r.digest, r.size) for r in results] == \
        [(o["mediaType"], o["digest"], o["size"]) for o in originals]
    for i, original in enumerate(originals):
        assert (tmp_path / "decrypted" / str(i)).read_bytes() == \
            Layout(tmp_path / "plain").blob_path(original["digest"]).read_bytes()


@pytest.mark.parametrize("kind", list(KEY_KINDS))
def test_skopeo_decrypts_what_torpor_encrypted(tmp_path: Path, key_dir: Path, kind: str) -> None:
    originals = write_plain_layout(tmp_path / "plain")
    torpor_encrypts(tmp_path / "plain", tmp_path / "encrypted", [f"jwe:{key_dir / kind}.pub"])
    run("skopeo", "copy", "-q", "--decryption-key", str(key_dir / f"{kind}.pem"),
        f"oci:{tmp_path / 'encrypted'}:{TAG}", f"oci:{tmp_path / 'decrypted'}:{TAG}")
    decrypted = manifest_of(tmp_path / "decrypted")["layers"]
    assert [(d["mediaType"], d["digest"], d["size"]) for d in decrypted] == \
        [(o["mediaType"], o["digest"], o["size"]) for o in originals]
    assert_blobs_intact(tmp_path / "decrypted")


def test_several_recipients_both_ways(tmp_path: Path, key_dir: Path) -> None:
    kinds = ["rsa2048", "ec-p256", "ec-p521"]
    originals = write_plain_layout(tmp_path / "plain")
    expected = [(o["mediaType"], o["digest"], o["size"]) for o in originals]
    options = [a for kind in kinds for a in ("--encryption-key", f"jwe:{key_dir / kind}.pub")]
    run("skopeo", "copy", "-q", *options, f"oci:{tmp_path / 'plain'}:{TAG}",
        f"oci:{tmp_path / 'by-skopeo'}:{TAG}")
    torpor_encrypts(tmp_path / "plain", tmp_path / "by-torpor",
                    [f"jwe:{key_dir / kind}.pub" for kind in kinds])
    for kind in kinds:
        results = torpor_decrypts(tmp_path / "by-skopeo", [key_dir / f"{kind}.pem"],
                                  tmp_path / f"torpor-{kind}")
        assert [(r.media_type, r.digest, r.size) for r in results] == expected
        out = tmp_path / f"skopeo-{kind}"
        run("skopeo", "copy", "-q", "--decryption-key", str(key_dir / f"{kind}.pem"),
            f"oci:{tmp_path / 'by-torpor'}:{TAG}", f"oci:{out}:{TAG}")
        assert [(d["mediaType"], d["digest"], d["size"]) for d in manifest_of(out)["layers"]] == expected
        assert_blobs_intact(out)


def test_skopeo_refuses_torpors_layers_with_another_key(tmp_path: Path, key_dir: Path) -> None:
    write_plain_layout(tmp_path / "plain")
    torpor_encrypts(tmp_path / "plain", tmp_path / "encrypted", [f"jwe:{key_dir / 'ec-p256'}.pub"])
    result = subprocess.run(["skopeo", "copy", "-q", "--decryption-key", str(key_dir / "ec-p384.pem"),
                             f"oci:{tmp_path / 'encrypted'}:{TAG}", f"oci:{tmp_path / 'decrypted'}:{TAG}"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "no suitable key" in result.stderr


def test_skopeo_decrypts_a_whole_checkpoint_layout(tmp_path: Path, key_dir: Path) -> None:
    """torpor's own layer types (skopeo cannot encrypt them, but it decrypts them), in a checkpoint's
    index of a runnable image and a state artifact, copied whole with --all."""
    written = write_checkpoint_layout(tmp_path / "ckpt", nested=False)
    layout = Layout(written.root)
    top = json.loads(layout.blob_path(str(written.top["digest"])).read_bytes())
    originals = {}
    for child in top["manifests"]:
        manifest = json.loads(layout.blob_path(child["digest"]).read_bytes())
        originals[child["digest"]] = [(m["mediaType"], m["digest"]) for m in manifest["layers"]]
        child.update(encrypt_layers(layout, manifest, [f"jwe:{key_dir / 'rsa2048'}.pub"]))
        assert all(ocicrypt.is_encrypted(m["mediaType"])
                   for m in json.loads(layout.blob_path(child["digest"]).read_bytes())["layers"])
    index = put(layout, json.dumps(top).encode(), "application/vnd.oci.image.index.v1+json")
    layout.tag(Descriptor.from_json(index, "index"), "ckpt-1")
    out = tmp_path / "decrypted"
    run("skopeo", "copy", "-q", "--all", "--decryption-key", str(key_dir / "rsa2048.pem"),
        f"oci:{written.root}:ckpt-1", f"oci:{out}:ckpt-1")
    decrypted_top = manifest_of(out)
    assert len(decrypted_top["manifests"]) == len(originals) == 2
    for child, expected in zip(decrypted_top["manifests"], originals.values(), strict=True):
        layers = json.loads(Layout(out).blob_path(child["digest"]).read_bytes())["layers"]
        assert [(m["mediaType"], m["digest"]) for m in layers] == expected
    assert {m[0] for layers in originals.values() for m in layers} >= {CRIU_LAYER, UNKNOWN_LAYER}
    assert_blobs_intact(out)
