"""torpor-runc in a Kubernetes pod (capture/pod.py): what kubelet's checkpoints get by default,
the descriptors.json that keeps other runtime classes from half-restoring them, and which
connections a restored pod closes."""

from __future__ import annotations

from pathlib import Path

import pytest

from torpor.capture import files, pod
from torpor.config import Config
from torpor.formats import names
from torpor.formats.network import SocketAddress
from torpor.shim.argv import Invocation
from torpor.shim.criu_flags import default_flags

POD_SPEC = {"annotations": {"io.kubernetes.cri.container-type": "container"}}
CHECKPOINT = Invocation(["torpor-runc", "checkpoint", "--image-path", "/i", "--leave-running",
                         "c1"])


def test_a_pod_container_is_told_from_a_sandbox_and_from_others() -> None:
    assert pod.in_pod(POD_SPEC)
    assert not pod.in_pod({"annotations": {"io.kubernetes.cri.container-type": "sandbox"}})
    assert not pod.in_pod({})


def test_kubelet_checkpoints_keep_connections_and_leave_the_rw_layer_to_containerd() -> None:
    cfg = Config()
    assert default_flags(cfg, CHECKPOINT, POD_SPEC, in_pod=True) == ["--tcp-established"]
    assert default_flags(cfg, CHECKPOINT, POD_SPEC) == []
    off = {"annotations": {**POD_SPEC["annotations"],
                           "io.torpor.checkpoint.tcp-established": "false"}}
    assert default_flags(cfg, CHECKPOINT, off, in_pod=True) == []
    assert not files.choose_policy(None, POD_SPEC, cfg, in_pod=True).rootfs
    assert files.choose_policy(None, POD_SPEC, cfg).rootfs


def test_descriptors_are_hidden_from_runc_and_given_back_by_torpor(tmp_path: Path) -> None:
    (tmp_path / names.RUNC_DESCRIPTORS).write_text('["/dev/null"]')
    pod.hide_descriptors(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [names.HIDDEN_DESCRIPTORS]
    assert pod.reveal_descriptors(str(tmp_path))
    assert (tmp_path / names.RUNC_DESCRIPTORS).read_text() == '["/dev/null"]'
    assert not pod.reveal_descriptors(str(tmp_path))  # already there: nothing to do
    empty = tmp_path / "plain"
    empty.mkdir()
    assert not pod.reveal_descriptors(str(empty))      # a plain runc checkpoint


SOCKETS = (SocketAddress("tcp", "0.0.0.0", 7000, "listen"),
           SocketAddress("tcp", "10.1.0.5", 7000, "established"),
           SocketAddress("tcp", "127.0.0.1", 7001, "established"),
           SocketAddress("tcp", "10.1.0.5", 7002, "close-wait"),
           SocketAddress("udp", "10.1.0.5", 53, "udp"))


@pytest.mark.parametrize(("present", "lost"), [
    (set(), [7000, 7002]),               # a new pod IP: both connections of the old one
    ({"10.1.0.5"}, []),                  # the same IP: kept
])
def test_connections_are_lost_when_the_pod_address_is_gone(present: set[str],
                                                           lost: list[int]) -> None:
    assert [s.port for s in pod.lost_connections(SOCKETS, present)] == lost
    assert [s.port for s in pod.connections(SOCKETS)] == [7000, 7001, 7002]


def test_tcp_close_config_keeps_runcs_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "runc.conf"
    base.write_text("log-file /tmp/x.log")
    monkeypatch.setattr(pod, "RUNC_CRIU_CONFIG", str(base))
    target = tmp_path / "rec" / "criu.conf"
    pod.write_tcp_close_config(str(target))
    assert target.read_text() == "log-file /tmp/x.log\ntcp-close\n"
    monkeypatch.setattr(pod, "RUNC_CRIU_CONFIG", str(tmp_path / "none"))
    pod.write_tcp_close_config(str(target))
    assert target.read_text() == "tcp-close\n"


@pytest.mark.parametrize("name", ["../../etc/shadow.tar", "/etc/x.tar", "volumes/0.tar",
                                  "pages-1.img"])
def test_a_volume_archive_is_a_torpor_file_name_and_nothing_else(tmp_path: Path,
                                                                 name: str) -> None:
    from torpor.capture import volumes
    from torpor.errors import RestoreError
    from torpor.formats.files import SavedVolume

    volume = SavedVolume(0, "/data", "/srv/data", "dir", False, name)
    with pytest.raises(RestoreError, match="not a file name torpor writes"):
        volumes.restore(volume, str(tmp_path), str(tmp_path / "target"))
