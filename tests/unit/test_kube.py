"""kubelet's checkpoint archive, read and written without containerd: its records as containerd
2.1.9 writes them, the archive's shape (what containerd and checkpointctl look for), hostile
archives, the checkpoint image's annotations, and a pod container's spec made standalone."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest
import zstandard

from torpor.capture import pod
from torpor.config import Config
from torpor.errors import ImageError, RestoreError, UnsafeArchive
from torpor.formats import kube, names
from torpor.formats.metadata import BaseImage
from torpor.formats.oci import Descriptor
from torpor.image import kube_archive, kube_image
from torpor.ops.kube import base_image_ref

from .samples import STATE

# As containerd 2.1.9 wrote them for a pod "p-torpor" (tests/test_kubernetes.py makes the same)
CONFIG_DUMP = (b'{"id":"0558","name":"p-torpor_p-torpor_default_fa95_0","rootfsImage":"127.0.0.1'
               b':36313/t/busybox:1","rootfsImageRef":"127.0.0.1:36313/t/busybox@sha256:a7ec","r'
               b'ootfsImageName":"127.0.0.1:36313/t/busybox:1","runtime":"io.containerd.runc.v2'
               b'","createdTime":"2026-12-01T05:06:13.874381892Z","checkpointedTime":"2026-12-0'
               b'1T05:06:14.287622437Z","restoredTime":"0001-01-01T00:00:00Z","restored":false}')
STATUS_DUMP = (b'{"id":"0558","metadata":{"name":"p-torpor"},"state":1,"created_at":17961015738'
               b'75098135,"image":{"image":"127.0.0.1:36313/t/busybox:1"},"image_ref":"127.0.0.1'
               b':36313/t/busybox@sha256:a7ec","mounts":[{"container_path":"/data","host_path":"'
               b'/x/data"}],"log_path":"/x/p.log","resources":{"linux":{}}}')
SPEC = {"ociVersion": "1.2.0", "annotations": {"io.kubernetes.cri.container-type": "container",
                                               "io.kubernetes.cri.container-name": "p-torpor",
                                               "io.kubernetes.cri.sandbox-name": "web",
                                               "io.kubernetes.cri.sandbox-namespace": "prod"}}


def test_containerds_records_read_back() -> None:
    config = kube.KubeContainerConfig.from_json(kube.loads(CONFIG_DUMP, "config.dump"))
    assert (config.id, config.runtime) == ("0558", "io.containerd.runc.v2")
    assert config.rootfs_image_ref == "127.0.0.1:36313/t/busybox@sha256:a7ec"
    assert kube.KubeContainerConfig.from_json(kube.loads(kube.dumps(config.to_json()),
                                                         "again")) == config
    status = kube.KubeContainerStatus.from_json(kube.loads(STATUS_DUMP, "status.dump"))
    assert (status.name, status.image, status.labels) == ("p-torpor",
                                                           "127.0.0.1:36313/t/busybox:1", {})
    again = kube.KubeContainerStatus.from_json(kube.loads(kube.dumps(status.to_json()), "x"))
    assert again == status
    assert status.to_json()["state"] == 1  # CONTAINER_RUNNING, as containerd wrote it


def write_sample(tmp_path: Path, rootfs: bytes | None = b"layer") -> Path:
    criu = tmp_path / "criu"
    criu.mkdir()
    (criu / "pages-1.img").write_bytes(b"\0" * 4096)
    (criu / "inventory.img").write_bytes(b"inv")
    (criu / names.RUNC_DESCRIPTORS).write_text('["/dev/null"]')
    (criu / names.CONTAINER_STATE).write_bytes(STATE.dumps())
    diff = None
    if rootfs is not None:
        diff = tmp_path / "rootfs.zst"
        diff.write_bytes(zstandard.ZstdCompressor().compress(rootfs))
    config = kube.KubeContainerConfig.from_json(kube.loads(CONFIG_DUMP, "config.dump"))
    status = kube.KubeContainerStatus.from_json(kube.loads(STATUS_DUMP, "status.dump"))
    out = tmp_path / "out.tar"
    kube_archive.write(str(out), kube_archive.ArchiveParts(
        criu_files=tuple(kube_archive.criu_files(str(criu), hide_descriptors=True)),
        config=config, spec=SPEC, status=status, rootfs_diff=str(diff) if diff else None))
    return out


def test_an_archive_has_the_shape_containerd_and_checkpointctl_expect(tmp_path: Path) -> None:
    out = write_sample(tmp_path)
    with tarfile.open(out) as tar:
        members = tar.getmembers()
    assert members[0].isdir() and members[0].name == "checkpoint"   # checkpointctl's check
    assert all(m.isfile() for m in members[1:])                      # containerd 2.1.9's filter
    assert [m.name for m in members[1:]] == [
        "checkpoint/inventory.img", "checkpoint/pages-1.img", "checkpoint/torpor-descriptors.json",
        "checkpoint/torpor-state.json", "config.dump", "rootfs-diff.tar", "spec.dump",
        "status.dump"]
    assert kube_archive.is_archive(str(out))
    found = kube_archive.read(str(out))
    assert found.container_name == "p-torpor"
    assert found.state == STATE
    assert found.memory_bytes == 4096
    assert found.checkpoint_bytes == sum(e.size for e in found.entries
                                         if e.path.startswith("checkpoint/"))
    assert found.rootfs_diff_bytes == len(zstandard.ZstdCompressor().compress(b"layer"))
    assert found.spec == SPEC


def test_not_an_archive_and_hostile_archives(tmp_path: Path) -> None:
    assert not kube_archive.is_archive(str(tmp_path))
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar")
    assert not kube_archive.is_archive(str(junk))

    def archive_with(*entries: tarfile.TarInfo) -> str:
        path = tmp_path / f"a{len(list(tmp_path.iterdir()))}.tar"
        with tarfile.open(path, "w") as tar:
            for info in entries:
                tar.addfile(info, io.BytesIO(b"{}"[:info.size]))
        return str(path)

    def file(name: str) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.size = 2
        return info

    link = tarfile.TarInfo("checkpoint/pages-1.img")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
    with pytest.raises(UnsafeArchive):
        kube_archive.read(archive_with(file("config.dump"), file("spec.dump"), link))
    with pytest.raises(UnsafeArchive):
        kube_archive.read(archive_with(file("../config.dump"), file("spec.dump")))
    with pytest.raises(ImageError, match=r"no config\.dump"):
        kube_archive.read(archive_with(file("spec.dump")))


@pytest.mark.parametrize("pack", [gzip.compress, zstandard.ZstdCompressor().compress,
                                  lambda data: data])
def test_rootfs_diff_in_any_compression(tmp_path: Path, pack: object) -> None:
    assert callable(pack)
    (tmp_path / "in").write_bytes(pack(b"tar bytes" * 100))
    kube_archive.decompress_layer(str(tmp_path / "in"), str(tmp_path / "out"))
    assert (tmp_path / "out").read_bytes() == b"tar bytes" * 100


def test_checkpoint_image_annotations_say_what_checkpointctl_build_says(tmp_path: Path) -> None:
    found = kube_archive.read(str(write_sample(tmp_path, rootfs=None)))
    assert kube_image.annotations_of(found) == {
        "org.criu.checkpoint.container.name": "p-torpor",
        "org.criu.checkpoint.engine.name": "containerd",
        "org.criu.checkpoint.pod.name": "web", "org.criu.checkpoint.pod.namespace": "prod",
        "org.criu.checkpoint.rootfsImageName": "127.0.0.1:36313/t/busybox:1",
        "org.criu.checkpoint.runtime.name": "io.containerd.runc.v2"}


@pytest.mark.parametrize(("name", "ref"), [
    ("127.0.0.1:5000/t/busybox:1", "127.0.0.1:5000/t/busybox@sha256:ab"),
    ("docker.io/library/busybox", "docker.io/library/busybox@sha256:ab"),
    ("r.example/a/b@sha256:cd", "r.example/a/b@sha256:cd"),
])
def test_base_image_ref_is_name_at_digest(name: str, ref: str) -> None:
    target = Descriptor("application/vnd.oci.image.index.v1+json", "sha256:ab", 1)
    base = BaseImage(name, target, target, "sha256:c", (), (), "")
    assert base_image_ref(base) == ref


def test_a_pod_container_made_standalone(tmp_path: Path) -> None:
    existing = tmp_path / "kept"
    existing.mkdir()
    spec = {"hostname": "web-1", "annotations": SPEC["annotations"],
            "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc", "path": "/proc/9/ns/ipc"},
                                     {"type": "network", "path": "/var/run/netns/cni-1"}]},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                       {"destination": "/etc/hosts", "type": "bind", "source": "/sb/hosts",
                        "options": ["rbind", "rw"]},
                       {"destination": "/dev/shm", "type": "bind", "source": "/sb/shm",
                        "options": ["rbind"]},
                       {"destination": "/cache", "type": "bind", "source": str(existing),
                        "options": ["rbind"]},
                       {"destination": "/data", "type": "bind", "source": "/gone/data",
                        "options": ["rbind"]}]}
    with pytest.raises(RestoreError, match="--netns"):
        pod.standalone(spec, str(tmp_path / "files"), network_given=False)
    spec["linux"]["namespaces"][2]["path"] = "/var/run/netns/given"   # what --netns put there
    alone = pod.standalone(spec, str(tmp_path / "files"), network_given=True)
    assert alone["linux"]["namespaces"] == [{"type": "pid"}, {"type": "ipc"}, {
        "type": "network", "path": "/var/run/netns/given"}]
    sources = {m["destination"]: m["source"] for m in alone["mounts"]}
    files = tmp_path / "files"
    assert sources == {"/proc": "proc", "/etc/hosts": str(files / "hosts"),
                       "/dev/shm": str(files / "shm"), "/cache": str(existing),
                       "/data": str(files / "volume-4")}
    assert "web-1" in (files / "hosts").read_text()
    assert (files / "volume-4").is_dir()
    assert spec["mounts"][1]["source"] == "/sb/hosts"   # the checkpoint's own spec: unchanged


def test_inspect_json_names_the_pod(tmp_path: Path) -> None:
    from torpor.ops.inspect import inspect

    report = inspect(str(write_sample(tmp_path)), config_for(tmp_path))
    doc = report.to_json()
    assert doc["kind"] == "kubelet-archive"
    assert doc["kubernetes"]["container"] == "p-torpor"
    assert doc["kubernetes"]["pod"] == "web" and doc["kubernetes"]["torpor_state"]
    assert doc["image"] == "127.0.0.1:36313/t/busybox:1"
    assert json.dumps(doc)  # all of it serialisable


def config_for(tmp_path: Path) -> Config:
    return Config({"image": {"store": str(tmp_path / "store")}})
