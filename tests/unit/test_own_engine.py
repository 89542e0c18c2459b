"""What Podman made for a container itself (capture/own_engine) is told apart by its place and
containers/storage's record of that very container; anything else stays a request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torpor.capture import own_engine
from torpor.formats.spec_requests import HostMount, Namespace

ID = "a" * 64
OTHER = "b" * 64
LAYER = "c" * 64
NETNS = "/run/netns/netns-0123abcd-0123-4567-89ab-0123456789ab"


def storage(tmp_path: Path, layer: str = LAYER) -> tuple[Path, Path, Path]:
    """(graphroot, runroot, bundle) of container ID, recorded with `layer`."""
    graphroot, runroot = tmp_path / "root", tmp_path / "run"
    bundle = graphroot / "overlay-containers" / ID / "userdata"
    bundle.mkdir(parents=True)
    (graphroot / "overlay-containers" / "containers.json").write_text(
        json.dumps([{"id": OTHER, "layer": LAYER}, {"id": ID, "layer": layer}]))
    (runroot / "overlay-layers").mkdir(parents=True)
    (runroot / "overlay-layers" / "mountpoints.json").write_text(json.dumps(
        [{"id": layer, "path": f"{graphroot}/overlay/{layer}/merged", "count": 1}]))
    return graphroot, runroot, bundle


def spec(root: str, binds: dict[str, str], netns: str = "") -> dict[str, Any]:
    network: dict[str, str] = {"type": "network", **({"path": netns} if netns else {})}
    return {"root": {"path": root},
            "mounts": [{"destination": d, "type": "bind", "source": s, "options": ["rbind"]}
                       for d, s in binds.items()],
            "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
                      + [network], "cgroupsPath": f"/libpod_parent/libpod-{ID}"}}


def test_podmans_own_root_files_and_namespace_are_not_requests(tmp_path: Path) -> None:
    graphroot, runroot, bundle = storage(tmp_path)
    userdata = runroot / "overlay-containers" / ID / "userdata"
    doc = spec(f"{graphroot}/overlay/{LAYER}/merged",
               {"/etc/hosts": f"{userdata}/hosts", "/etc/hostname": f"{userdata}/hostname",
                "/run/.containerenv": f"{userdata}/.containerenv",
                "/dev/shm": f"{bundle}/shm", "/data": "/srv/data"}, NETNS)
    requests = own_engine.requests_of(doc, str(bundle), ID)
    assert requests.root_path == "rootfs"
    assert requests.host_mounts == (HostMount("/data", "/srv/data", "bind", False),)
    assert requests.namespaces == ()  # at checkpoint time: the one the container is in
    assert requests.cgroups_path == "/libpod_parent/libpod-{id}"
    # restoring, only a fresh namespace Podman made is its own; this one does not exist
    restoring = own_engine.requests_of(doc, str(bundle), ID, restoring=True)
    assert restoring.namespaces == (Namespace("network", NETNS),)


def test_what_is_not_this_containers_own_stays_a_request(tmp_path: Path) -> None:
    graphroot, runroot, bundle = storage(tmp_path)
    theirs = runroot / "overlay-containers" / OTHER / "userdata"
    ours = runroot / "overlay-containers" / ID / "userdata"
    elsewhere = tmp_path / "other-storage" / "run" / "overlay-containers" / ID / "userdata"
    binds = {"/etc/hosts": f"{theirs}/hosts",                       # another container's
             "/etc/resolv.conf": f"{elsewhere}/resolv.conf",         # another storage's
             "/etc/passwd": f"{ours}/passwd",                       # not a file Podman makes
             "/etc/hostname": f"{ours}/../../../../etc/hostname",   # out of the directory
             "/x": f"{bundle}/hosts", "/y": "/etc/shadow"}
    for root in (f"{graphroot}/overlay/{OTHER}/merged", "/", f"{graphroot}/overlay/{LAYER}"):
        requests = own_engine.requests_of(spec(root, binds), str(bundle), ID)
        assert requests.root_path == root
        assert {m.destination for m in requests.host_mounts} == set(binds)


def test_without_containers_storage_record_nothing_is_the_engines(tmp_path: Path) -> None:
    graphroot, runroot, bundle = storage(tmp_path, layer="not-a-layer")
    doc = spec(f"{graphroot}/overlay/{LAYER}/merged",
               {"/etc/hosts": f"{runroot}/overlay-containers/{ID}/userdata/hosts"})
    assert own_engine.requests_of(doc, str(bundle), ID).root_path != "rootfs"
    # a containerd bundle, or an id that is a name: the requests as the spec has them
    for bundle_dir, container_id in ((str(tmp_path / "run" / "web"), ID),
                                     (str(bundle), "web")):
        requests = own_engine.requests_of(doc, bundle_dir, container_id)
        assert requests.root_path.endswith("/merged") and len(requests.host_mounts) == 1
