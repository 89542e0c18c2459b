"""A restore into a spec the engine made (a Kubernetes restore, a restore on create): what acts
only at a restore is still the policy's, and saved volumes go only where the engine made room
for them (a pod author's hostPath is no such place), never read-only, never setuid."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from torpor import archive
from torpor.capture import files, restore_policy
from torpor.capture.restore_policy import RestorePolicy
from torpor.errors import RestoreError
from torpor.formats.spec_requests import SpecRequests

EMPTY_DIR = "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/data"


def requests_of(annotations: dict[str, str]) -> SpecRequests:
    return SpecRequests.of({"root": {"path": "rootfs"}, "annotations": annotations})


@pytest.mark.parametrize("key", ["org.criu.config", "io.torpor.restore.add-addresses"])
def test_an_annotation_that_acts_only_at_restore_is_the_policys(key: str) -> None:
    with pytest.raises(RestoreError, match=key):
        restore_policy.check_engine_made(requests_of({key: "/x"}), RestorePolicy())
    restore_policy.check_engine_made(requests_of({key: "/x"}), RestorePolicy(annotations=(key,)))


def test_what_acts_at_create_too_is_the_engines() -> None:
    restore_policy.check_engine_made(requests_of({
        "io.kubernetes.cri.sandbox-id": "abc", "io.containerd.runc.v2.group": "g",
        "org.opencontainers.image.title": "t"}), RestorePolicy())


@pytest.mark.parametrize("source, options, in_pod, allowed", [
    (EMPTY_DIR, ["rbind", "rw"], True, True),
    ("/run/containerd/io.containerd.grpc.v1.cri/sandboxes/s1/shm", ["rbind"], True, True),
    ("/etc/cron.d", ["rbind", "rw"], True, False),                 # a hostPath the pod chose
    ("/srv/shared", ["rbind", "rw"], True, True),                  # named by mount_sources
    (EMPTY_DIR, ["rbind", "ro"], True, False),                     # read-only
    ("/etc/cron.d", ["rbind", "rw"], False, True),                 # ctr's own --mount, as root
    ("/etc/cron.d", ["rbind", "ro"], False, False),
])
def test_where_a_saved_volume_may_go(source: str, options: list[str], in_pod: bool,
                                     allowed: bool) -> None:
    mount = {"destination": "/data", "source": source, "options": options}
    if allowed:
        files.refuse_engine_source("/data", source, mount, in_pod, ("/srv/shared",))
    else:
        with pytest.raises(RestoreError, match="/data"):
            files.refuse_engine_source("/data", source, mount, in_pod, ("/srv/shared",))


def test_no_setid_bit_is_written_where_another_chose(tmp_path: Path) -> None:
    tar_path = tmp_path / "v.tar"
    with tarfile.open(tar_path, "w") as tar:
        info = tarfile.TarInfo("tool")
        info.mode, info.size = 0o4755, 4
        tar.addfile(info, io.BytesIO(b"#!/x"))
    archive.extract(str(tar_path), str(tmp_path / "kept"), setid=True)
    archive.extract(str(tar_path), str(tmp_path / "stripped"), setid=False)
    assert os.stat(tmp_path / "kept" / "tool").st_mode & stat.S_ISUID
    assert stat.S_IMODE(os.stat(tmp_path / "stripped" / "tool").st_mode) == 0o755
