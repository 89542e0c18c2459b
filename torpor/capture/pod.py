"""Containers in Kubernetes pods, as containerd's CRI plugin runs them (kubelet's checkpoints).

containerd's `CheckpointContainer` runs `torpor-runc checkpoint` with no torpor request and
copies the image directory into kubelet's archive; the pod that restores the archive runs
`torpor-runc restore` only when its runtime class is `torpor`: the archive does not say which
runtime made it. So, in a pod:

- runc's `descriptors.json` is kept as `torpor-descriptors.json` (`hide_descriptors`): `runc
  restore` reads that file before it starts CRIU, so a pod of another runtime class fails at
  once ("open .../descriptors.json: no such file or directory") instead of restoring the memory
  without the volumes, /dev/shm and CRIU flags torpor saved; torpor-runc puts it back
  (`reveal_descriptors`) in the copy containerd unpacked;
- the read-write layer is left to containerd, which saves it as the archive's rootfs-diff.tar
  and applies it before `runc restore`;
- connections: a restored pod has a new IP, so established TCP connections whose local address
  the pod's namespace lacks are restored closed (CRIU's tcp-close, through a CRIU config file):
  the workload sees them end, as after any network failure, and keeps its listening sockets.

Stdlib only: torpor-runc imports it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
from collections.abc import Iterable, Sequence

from torpor.atomicfile import write_atomic
from torpor.formats import annotations as ann
from torpor.formats import names
from torpor.formats.network import SocketAddress
from torpor.formats.oci import OciSpec

RUNC_CRIU_CONFIG = "/etc/criu/runc.conf"   # what runc gives CRIU when no annotation names one
TCP_UNCONNECTED = ("listen", "close")


def in_pod(spec: OciSpec) -> bool:
    """A container (not a sandbox) that containerd's CRI plugin created."""
    return (spec.get("annotations") or {}).get(ann.CRI_CONTAINER_TYPE) == "container"


# What kubelet and containerd's CRI make for one pod: its emptyDir volumes, and its sandbox's
# /dev/shm (a tmpfs of the sandbox's own)
MADE_FOR_POD = re.compile(r"/volumes/kubernetes\.io~empty-dir/[^/]+\Z"
                          r"|/io\.containerd\.grpc\.v1\.cri/sandboxes/[^/]+/shm\Z")


def made_for_pod(source: str) -> bool:
    """Whether a bind source is one kubelet or containerd made for the pod, not a host path
    the pod's author chose (hostPath)."""
    source = source.rstrip("/")
    return (source.startswith("/") and ".." not in source.split("/")
            and MADE_FOR_POD.search(source) is not None)


def hide_descriptors(image_path: str) -> None:
    """After `runc checkpoint`: keep runc's descriptors.json under torpor's name."""
    source = os.path.join(image_path, names.RUNC_DESCRIPTORS)
    if os.path.exists(source):
        os.replace(source, os.path.join(image_path, names.HIDDEN_DESCRIPTORS))


def reveal_descriptors(image_path: str) -> bool:
    """Before `runc restore`: descriptors.json back from torpor's copy; True if it was hidden."""
    target = os.path.join(image_path, names.RUNC_DESCRIPTORS)
    hidden = os.path.join(image_path, names.HIDDEN_DESCRIPTORS)
    if os.path.exists(target) or not os.path.exists(hidden):
        return False
    shutil.copyfile(hidden, target)
    return True


def connections(sockets: Iterable[SocketAddress]) -> list[SocketAddress]:
    """The connected TCP sockets (what CRIU dumps with tcp-established)."""
    return [s for s in sockets if s.proto == "tcp" and s.state not in TCP_UNCONNECTED]


def lost_connections(sockets: Sequence[SocketAddress], present: set[str]) -> list[SocketAddress]:
    """Connected TCP sockets whose specific local address is not among `present`."""
    lost = []
    for s in connections(sockets):
        address = ipaddress.ip_address(s.address)
        if not (address.is_loopback or address.is_unspecified) and s.address not in present:
            lost.append(s)
    return lost


def write_tcp_close_config(path: str) -> None:
    """A CRIU config file: runc's usual one (when the node has it), plus tcp-close."""
    base = ""
    try:
        with open(RUNC_CRIU_CONFIG, encoding="utf-8") as f:
            base = f.read()
    except OSError:
        pass
    if base and not base.endswith("\n"):
        base += "\n"
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_atomic(path, (base + "tcp-close\n").encode(), mode=0o600)


# A pod's container restored outside any pod (`torpor restore` of a kubelet checkpoint) -------

# What the CRI plugin bind-mounts from the pod's sandbox: the restored container gets its own.
POD_FILES = {"/etc/hosts": "hosts", "/etc/hostname": "hostname",
             "/etc/resolv.conf": "resolv.conf", "/dev/termination-log": "termination-log"}
POD_SHM = "/dev/shm"


def standalone(spec: OciSpec, files_dir: str, network_given: bool) -> OciSpec:
    """A copy of a pod container's spec that runs on its own: namespaces of its own instead of
    the pod's, but the network namespace the caller gave (`network_given`: CRIU restores a
    container that joined its pod's namespace only into an existing one); for the sandbox's
    files and /dev/shm, and any volume whose source this node lacks, new ones under `files_dir`
    (the checkpoint's saved volumes fill them): CRIU needs every bind mount it dumped."""
    import copy

    from torpor.errors import RestoreError

    spec = copy.deepcopy(spec)
    for ns in (spec.get("linux") or {}).get("namespaces") or []:
        if ns.get("type") == "network" and ns.get("path") and not network_given:
            raise RestoreError(
                "this checkpoint comes from a Kubernetes pod, whose network namespace its "
                "container joined: CRIU restores it only into an existing one",
                hint="give it one: ip netns add NAME, then --netns /var/run/netns/NAME")
        if ns.get("path") and ns.get("type") != "network":
            del ns["path"]
    os.makedirs(files_dir, mode=0o700, exist_ok=True)
    for index, mount in enumerate(spec.get("mounts") or []):
        options = mount.get("options") or [] if isinstance(mount, dict) else None
        if not isinstance(options, list) or (
                mount.get("type") != "bind" and "bind" not in options and "rbind" not in options):
            continue
        destination = str(mount.get("destination", "")).rstrip("/")
        if destination in POD_FILES:
            mount["source"] = _pod_file(files_dir, POD_FILES[destination], spec)
        elif destination == POD_SHM:
            mount["source"] = _fresh_dir(os.path.join(files_dir, "shm"), 0o1777)
        elif not os.path.exists(str(mount.get("source", ""))):
            mount["source"] = _fresh_dir(os.path.join(files_dir, f"volume-{index}"), 0o755)
    annotations = spec.get("annotations")
    if isinstance(annotations, dict):  # no longer in that sandbox: no shim to share
        annotations.pop(ann.CRI_SANDBOX_ID, None)
    return spec


def own_engine_files(spec: OciSpec, files_dir: str, mapped: frozenset[str]) -> OciSpec:
    """A copy of the spec whose engine-managed files (/etc/hosts, /etc/hostname,
    /etc/resolv.conf bind mounts) are torpor's own, under `files_dir`, unless the user mapped
    their destinations (`mapped`): their sources are paths of the engine that made the
    container (nerdctl's data root, a pod's sandbox) and mean nothing on another node. A saved
    copy in the checkpoint, if any, is written over them at restore."""
    import copy

    spec = copy.deepcopy(spec)
    made = False
    for mount in spec.get("mounts") or []:
        options = mount.get("options") or [] if isinstance(mount, dict) else None
        if not isinstance(options, list):
            continue   # malformed: the spec's check (SpecRequests) refuses it in words
        destination = str(mount.get("destination", "")).rstrip("/")
        bind = mount.get("type") == "bind" or "bind" in options or "rbind" in options
        if bind and destination in POD_FILES and destination not in mapped:
            if not made:
                os.makedirs(files_dir, mode=0o700, exist_ok=True)
                made = True
            mount["source"] = _pod_file(files_dir, POD_FILES[destination], spec)
    return spec


def _pod_file(files_dir: str, name: str, spec: OciSpec) -> str:
    hostname = str(spec.get("hostname") or "localhost")
    content = {"hosts": f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                        f"127.0.1.1\t{hostname}\n",
               "hostname": f"{hostname}\n"}.get(name)
    path = os.path.join(files_dir, name)
    if content is None and name == "resolv.conf":
        try:
            with open("/etc/resolv.conf", encoding="utf-8") as f:
                content = f.read()
        except OSError:
            content = ""
    write_atomic(path, (content or "").encode(), mode=0o644)
    return path


def _fresh_dir(path: str, mode: int) -> str:
    os.makedirs(path, exist_ok=True)
    os.chmod(path, mode)
    return path
