"""Where a lazily restored container's processes will be, for the guard that kills them if
torpor dies first (ops/restore._cgroup_dirs): cgroupfs paths as they are, systemd's
slice:prefix:name as systemd lays it out, on cgroup v1's freezer and on v2."""

from __future__ import annotations

from torpor.ops.restore import _cgroup_dirs


def test_cgroupfs_and_systemd_paths() -> None:
    assert _cgroup_dirs({"linux": {"cgroupsPath": "/default/web"}}) == [
        "/sys/fs/cgroup/freezer/default/web", "/sys/fs/cgroup/default/web"]
    assert _cgroup_dirs({"linux": {"cgroupsPath": "kubepods-besteffort-pod1.slice:cri:ab"}})[1] \
        == "/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/" \
           "kubepods-besteffort-pod1.slice/cri-ab.scope"
    assert _cgroup_dirs({"linux": {"cgroupsPath": ":torpor:web"}})[1] == \
        "/sys/fs/cgroup/system.slice/torpor-web.scope"
    assert _cgroup_dirs({"linux": {}}) == []
