"""What a container's own engine made for it on this node, told apart from what its spec asks.

Podman (containers/storage, overlay driver) gives every container a root and a few files of its
own, and writes their paths into the spec it hands torpor-runc:
- the root at `<graphroot>/overlay/<layer>/merged`, where
  `<graphroot>/overlay-containers/containers.json` records `<layer>` as this container's;
- the bundle `<graphroot>/overlay-containers/<id>/userdata`, with its `shm`;
- `<runroot>/overlay-containers/<id>/userdata/{hosts,hostname,resolv.conf,.containerenv}`,
  where `<runroot>/overlay-layers/mountpoints.json` has that very layer mounted;
- on its default network, a namespace `/run/netns/netns-<uuid>`; at restore, a fresh one.
A restore gets new ones (`podman container restore --import` mounts a new layer and makes new
files; every restore on a bridge gets a new namespace), so they are neither requests of the
checkpoint nor part of the seal: they are recognised here by their place, for the container id
runc is given, and only where containers/storage's own records of that container agree. A
checkpoint cannot choose them (Podman sets the root, the namespace and its files itself); a spec
that points anything else at a host path, or one of these places at another container's or
another storage's files, keeps it as a request.

Stdlib only: torpor-runc imports it.
"""

from __future__ import annotations

import dataclasses
import json
import os

from torpor.formats.oci import OciSpec
from torpor.formats.spec_requests import SpecRequests

STORAGE_DRIVER = "overlay"
CONTAINERS_JSON = "containers.json"
ENGINE_FILES = frozenset({"hosts", "hostname", "resolv.conf", ".containerenv"})  # in runroot
BUNDLE_FILES = frozenset({"shm"})                                                 # in the bundle
NETNS_DIR = "/run/netns"
_MAX_RECORD = 64 << 20
_HEX = frozenset("0123456789abcdef")


def is_engine_id(value: str) -> bool:
    """A 64-hex-digit id, as Podman (and containerd's clients) make them."""
    return len(value) == 64 and set(value) <= _HEX


def storage_layer(bundle: str, container_id: str) -> tuple[str, str] | None:
    """(graphroot, layer) when `bundle` is containers/storage's directory of `container_id`
    and its record names the container's layer; else None."""
    if not is_engine_id(container_id):
        return None
    userdata = os.path.normpath(os.path.abspath(bundle))
    ctr_dir, leaf = os.path.split(userdata)
    containers, ctr = os.path.split(ctr_dir)
    graphroot, kind = os.path.split(containers)
    if leaf != "userdata" or ctr != container_id or kind != f"{STORAGE_DRIVER}-containers" \
            or os.path.realpath(userdata) != userdata:
        return None
    records = _read_json(os.path.join(containers, CONTAINERS_JSON))
    for record in records if isinstance(records, list) else []:
        if isinstance(record, dict) and record.get("id") == container_id:
            layer = record.get("layer")
            return (graphroot, layer) if isinstance(layer, str) and is_engine_id(layer) else None
    return None


def _engine_root(root: str, place: tuple[str, str] | None) -> bool:
    if place is None:
        return False
    graphroot, layer = place
    return os.path.normpath(root) == os.path.join(graphroot, STORAGE_DRIVER, layer, "merged")


def _read_json(path: str) -> object:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read(_MAX_RECORD))
    except (OSError, ValueError):
        return None


def _runroot_of(runroot: str, place: tuple[str, str]) -> bool:
    """Whether `runroot` is the run root of the storage whose layer `place` is: its record of
    mounted layers has that layer mounted at the graph root's place for it."""
    graphroot, layer = place
    merged = os.path.join(graphroot, STORAGE_DRIVER, layer, "merged")
    mounts = _read_json(os.path.join(runroot, f"{STORAGE_DRIVER}-layers", "mountpoints.json"))
    return any(isinstance(m, dict) and m.get("id") == layer and m.get("path") == merged
               for m in (mounts if isinstance(mounts, list) else []))


def _engine_file(source: str, bundle: str, container_id: str, place: tuple[str, str]) -> bool:
    if not source.startswith("/") or os.path.normpath(source) != source:
        return False
    directory, name = os.path.split(source)
    if directory == os.path.normpath(os.path.abspath(bundle)):
        return name in BUNDLE_FILES
    ctr_dir, leaf = os.path.split(directory)
    containers, ctr = os.path.split(ctr_dir)
    runroot, kind = os.path.split(containers)
    return (name in ENGINE_FILES and leaf == "userdata" and ctr == container_id
            and kind == f"{STORAGE_DRIVER}-containers" and _runroot_of(runroot, place))


def _podman_netns_name(path: str) -> bool:
    """`/run/netns/netns-XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX`: where rootful Podman (its
    netavark or CNI setup) makes a container's network namespace."""
    directory, name = os.path.split(path)
    parts = name.split("-")
    return (directory == NETNS_DIR and len(parts) == 6 and parts[0] == "netns"
            and [len(p) for p in parts[1:]] == [8, 4, 4, 4, 12]
            and all(set(p) <= _HEX for p in parts[1:]))


def fresh_netns(path: str) -> bool:
    """A network namespace made for this restore: Podman's name for one, a namespace file
    (not our own namespace) that no process is in yet."""
    if not _podman_netns_name(path):
        return False
    try:
        target = os.stat(path)
        if target.st_ino == os.stat("/proc/self/ns/net").st_ino:
            return False
    except OSError:
        return False
    if os.stat(os.path.dirname(path)).st_dev == target.st_dev:
        return False  # a plain file, not a namespace bound there
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ns = os.stat(f"/proc/{entry}/ns/net")
            except OSError:
                continue
            if (ns.st_dev, ns.st_ino) == (target.st_dev, target.st_ino):
                return False
    return True


def requests_of(spec: OciSpec, bundle: str, container_id: str,
                restoring: bool = False) -> SpecRequests:
    """The spec's requests (SpecRequests.of), less what the container's own engine made for
    it on this node: a root and files of the container's own in containers/storage (the root
    then reads as the bundle's, which it is in all but place) and, Podman's network namespace:
    at checkpoint time the one the container is in, when `restoring` only a fresh one."""
    requests = SpecRequests.of(spec)
    place = storage_layer(bundle, container_id)
    if place is None:
        return requests
    own_root = _engine_root(requests.root_path, place)
    mounts = tuple(m for m in requests.host_mounts if not (
        m.type == "bind" and _engine_file(m.source, bundle, container_id, place)))
    namespaces = tuple(
        ns for ns in requests.namespaces
        if not (ns.type == "network" and _podman_netns_name(ns.path)
                and (not restoring or fresh_netns(ns.path))))
    # Podman names the container's cgroup after its id, which `--import --name` changes
    cgroups = requests.cgroups_path.replace(container_id, "{id}")
    return dataclasses.replace(requests, root_path="rootfs" if own_root else requests.root_path,
                               host_mounts=mounts, namespaces=namespaces,
                               cgroups_path=cgroups)
