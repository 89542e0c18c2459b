"""Test images built from busybox-static: an OCI layout directory and a tar of it for `ctr import`."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Iterable
from pathlib import Path

BUSYBOX = "/bin/busybox"


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
    tar.addfile(info)


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 0
    tar.addfile(info)


def busybox_applets() -> list[str]:
    out = subprocess.run([BUSYBOX, "--list"], check=True, capture_output=True, text=True).stdout
    return sorted(set(out.split()) - {"busybox"})


def rootfs_layer(extra_files: dict[str, tuple[bytes, int]]) -> bytes:
    """An uncompressed tar of a busybox root filesystem plus `extra_files` {path: (data, mode)}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "etc", "tmp", "root", "var", "var/log", "data", "proc", "sys", "dev", "run"):
            _add_dir(tar, d, 0o1777 if d == "tmp" else 0o755)
        with open(BUSYBOX, "rb") as f:
            _add_file(tar, "bin/busybox", f.read(), 0o755)
        for applet in busybox_applets():
            if "/" not in applet and applet not in ("[", "[["):
                _add_link(tar, f"bin/{applet}", "busybox")
        _add_file(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        _add_file(tar, "etc/group", b"root:x:0:\n")
        _add_file(tar, "etc/hostname", b"torpor-test\n")
        for path, (data, mode) in sorted(extra_files.items()):
            _add_file(tar, path.lstrip("/"), data, mode)
    return buf.getvalue()


def write_layout(
    directory: Path,
    name: str,
    extra_files: dict[str, tuple[bytes, int]] | None = None,
    cmd: Iterable[str] = ("sh",),
) -> dict[str, str]:
    """Write an OCI image layout for `name`; returns the digests of its parts."""
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        digest = _sha256(data)
        (blobs / digest.split(":")[1]).write_bytes(data)
        return digest

    layer = rootfs_layer(extra_files or {})
    compressed = gzip.compress(layer, mtime=0)
    layer_digest = put(compressed)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": list(cmd), "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_sha256(layer)]},
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_digest = put(config_bytes)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest, "size": len(compressed)}],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest = put(manifest_bytes)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": len(manifest_bytes),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]},
        }],
    }
    (directory / "index.json").write_text(json.dumps(index))
    (directory / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return {"manifest": manifest_digest, "config": config_digest, "layer": layer_digest}


def layout_tar(directory: Path, out: Path) -> Path:
    with tarfile.open(out, "w") as tar:
        for entry in sorted(os.listdir(directory)):
            tar.add(directory / entry, arcname=entry)
    return out


def compile_static(source: Path, out: Path) -> bytes:
    subprocess.run(["gcc", "-O2", "-static", "-o", str(out), str(source)], check=True)
    return out.read_bytes()
