"""What a restored container may have on this node: a checkpoint's spec (its requests,
torpor.formats.spec_requests) against the node's policy (`[restore]` in the config) and what the
user granted on the command line.

Allowed without asking: the root at `rootfs` in the bundle; containerd's default devices and
capabilities; a namespace of each kind of the container's own; filesystems that are the
container's own (proc, sysfs, tmpfs, devpts, mqueue, cgroup). Everything else needs the policy
or the user: hooks (`[restore] hooks`, or `--allow-spec-hooks`), bind mounts and other host
filesystems (`[restore] mount_sources`, or `--volume DEST[=SOURCE]`), devices (`[restore]
devices`), capabilities (`[restore] capabilities`), host or joined namespaces (`[restore]
host_namespaces`; a network namespace given with `--netns`), annotations that runc, CRIU, a shim
or torpor acts on (`[restore] annotations`, by exact key or a pattern within its own prefix, or the
user's own `--add-addresses`). Other annotations are inert: a restored spec keeps those the policy
names and loses the rest (admit_annotations). A root path elsewhere and a cgroup path with `..`
are refused outright.

`torpor restore` checks before anything is created and leaves what it granted in a record for
torpor-runc, which checks again: it leaves what it granted in the restore's own work directory
(the --work-path torpor-runc is given). A Kubernetes restore's spec is kubelet's, not the
checkpoint's (containerd's CRI builds it from the CreateContainer request): torpor-runc leaves it
to kubelet. Any other restore no torpor command granted (ctr, nerdctl) is checked by torpor-runc
against the policy alone, unless this node sealed the very same requests at checkpoint time:
torpor-runc checkpoint records an HMAC of the spec's requests under a key that never leaves the
node (`<[image] store>/node.key`), so a container this node already ran with those requests
(nerdctl restoring its own container, ctr restoring a checkpoint taken here) is not refused what
it had, while a spec from elsewhere, or a tampered one, meets the policy. This lives in capture/
because torpor-runc, which imports only the ground floor and capture/, needs it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torpor.archive import ArchiveLimits
from torpor.atomicfile import write_atomic
from torpor.config import Config
from torpor.errors import FormatError, RestoreError
from torpor.formats.spec_requests import (
    ACTED_ON_ANNOTATIONS,
    GRANT_FILE,
    Annotation,
    Device,
    Namespace,
    RestoreGrant,
    SpecRequests,
    acted_on,
    matches,
)

if TYPE_CHECKING:
    from torpor.reporting import Log

GRANT_TTL_S = 600
# containerd's default device rules: null, zero, full, random, urandom, tty, console, ptmx,
# the pts, tun
DEFAULT_DEVICES = ("c 1:3", "c 1:5", "c 1:7", "c 1:8", "c 1:9", "c 5:0", "c 5:1", "c 5:2",
                   "c 136:*", "c 10:200")


@dataclass(frozen=True)
class RestorePolicy:
    hooks: tuple[str, ...] = ()
    mount_sources: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    host_namespaces: tuple[str, ...] = ()
    annotations: tuple[str, ...] = ()   # keys, or prefix* patterns

    @classmethod
    def of(cls, cfg: Config) -> RestorePolicy:
        return cls(tuple(cfg.restore_hooks), tuple(cfg.restore_mount_sources),
                   tuple(cfg.restore_devices), tuple(cfg.restore_capabilities),
                   tuple(cfg.restore_host_namespaces), tuple(cfg.restore_annotations))


@dataclass(frozen=True)
class UserGrants:
    """What the user allowed on the command line."""

    spec_hooks: bool = False                          # --allow-spec-hooks
    mounts: frozenset[str] = field(default_factory=frozenset)  # destinations given by --volume
    netns: str | None = None                          # --netns PATH
    own_sources: tuple[str, ...] = ()                 # files torpor made for this restore
    annotations: frozenset[str] = frozenset()         # keys set by the user (--add-addresses)


@dataclass(frozen=True)
class Verdict:
    what: str          # the request, in words
    allowed_by: str    # "" when refused
    remedy: str = ""   # what would allow it


def verdicts(requests: SpecRequests, policy: RestorePolicy,
             grants: UserGrants = UserGrants()) -> list[Verdict]:
    """Every request of the spec, with what allows it or what would."""
    out: list[Verdict] = []
    root = requests.root_path
    out.append(Verdict(f"root filesystem at {root!r}", "the bundle" if root == "rootfs" else "",
                       "" if root == "rootfs" else "none: the root must be the bundle's rootfs"))
    for hook in requests.hooks:
        by = ("[restore] hooks" if hook.path in policy.hooks else
              "--allow-spec-hooks" if grants.spec_hooks else "")
        out.append(Verdict(f"{hook.stage} hook {hook.path} {hook.args}".rstrip(), by,
                           "--allow-spec-hooks, or the path in [restore] hooks"))
    for mount in requests.host_mounts:
        destination = mount.destination.rstrip("/") or "/"
        by = ("--volume" if destination in grants.mounts else
              "torpor's own files" if _under(mount.source, grants.own_sources) else
              "[restore] mount_sources" if _under(mount.source, policy.mount_sources) else "")
        kind = "bind mount" if mount.type == "bind" else f"{mount.type or 'untyped'} mount"
        out.append(Verdict(f"{kind} of host path {mount.source!r} at {mount.destination}"
                           + (" (read-only)" if mount.read_only else ""), by,
                           f"--volume {destination}=NEW_SOURCE, --volume {destination} to accept "
                           "it, or [restore] mount_sources"))
    allowed_devices = [*DEFAULT_DEVICES, *policy.devices]
    for device in requests.devices:
        default = _device_allowed(device, DEFAULT_DEVICES)
        by = "default" if default else (
            "[restore] devices" if _device_allowed(device, allowed_devices) else "")
        out.append(Verdict(device.describe(), by, f'[restore] devices = ["{_rule(device)}"]'))
    for capability in requests.capabilities:
        out.append(Verdict(f"capability {capability}", "[restore] capabilities"
                           if capability in policy.capabilities else "",
                           f'[restore] capabilities = ["{capability}"]'))
    for ns in requests.namespaces:
        out.append(_namespace_verdict(ns, policy, grants))
    for annotation in requests.annotations:
        out.append(_annotation_verdict(annotation, policy, grants))
    cgroups = requests.cgroups_path
    if cgroups and ".." in cgroups.replace(":", "/").split("/"):
        out.append(Verdict(f"cgroup path {cgroups!r}", "", "none: '..' is refused"))
    return out


def refusals(requests: SpecRequests, policy: RestorePolicy,
             grants: UserGrants = UserGrants()) -> list[Verdict]:
    return [v for v in verdicts(requests, policy, grants) if not v.allowed_by]


def check(requests: SpecRequests, policy: RestorePolicy, grants: UserGrants = UserGrants()) -> None:
    """RestoreError listing every request of the spec that nothing allows."""
    refused = refusals(requests, policy, grants)
    if refused:
        lines = "\n".join(f"  - {v.what} (allow with: {v.remedy})" for v in refused)
        raise RestoreError("the checkpoint's spec asks for what this node's restore policy "
                           f"does not allow:\n{lines}",
                           hint="torpor inspect shows what a restore would grant")


def under(path: str, prefixes: tuple[str, ...]) -> bool:
    """Whether `path` (absolute, no '..') is one of `prefixes` or below one."""
    return _under(path, prefixes)


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    if not path.startswith("/") or ".." in path.split("/"):
        return False
    normal = os.path.normpath(path)
    return any(normal == os.path.normpath(p) or normal.startswith(os.path.normpath(p).rstrip("/")
                                                                  + "/")
               for p in prefixes if p.startswith("/"))


def _rule(device: Device) -> str:
    return (f"{device.kind} {'*' if device.major < 0 else device.major}:"
            f"{'*' if device.minor < 0 else device.minor}")


def _device_allowed(device: Device, rules: list[str] | tuple[str, ...]) -> bool:
    kind = "c" if device.kind == "u" else device.kind
    for rule in rules:
        rule_kind, _, numbers = rule.partition(" ")
        major, _, minor = numbers.partition(":")
        if rule_kind not in (kind, "a"):
            continue
        if major != "*" and (device.major < 0 or major != str(device.major)):
            continue
        if minor != "*" and (device.minor < 0 or minor != str(device.minor)):
            continue
        return True
    return False


def _namespace_verdict(ns: Namespace, policy: RestorePolicy, grants: UserGrants) -> Verdict:
    if not ns.path:
        return Verdict(f"the host's {ns.type} namespace (the spec has none of its own)",
                       "[restore] host_namespaces" if ns.type in policy.host_namespaces else "",
                       f'[restore] host_namespaces = ["{ns.type}"]')
    by = ("--netns" if ns.type == "network" and grants.netns and
          os.path.normpath(ns.path) == os.path.normpath(grants.netns) else
          "[restore] host_namespaces" if ns.type in policy.host_namespaces else "")
    remedy = "--netns PATH" if ns.type == "network" else \
        f'[restore] host_namespaces = ["{ns.type}"]'
    return Verdict(f"joining the {ns.type} namespace {ns.path}", by, remedy)


def _annotation_verdict(annotation: Annotation, policy: RestorePolicy,
                        grants: UserGrants) -> Verdict:
    key = annotation.key
    by = ("the user" if key in grants.annotations else
          "[restore] annotations" if names_acted_on(key, policy.annotations) else "")
    return Verdict(f"annotation {key}={annotation.value!r}, which "
                   f"{_ACTED_ON_BY.get(_prefix_of(key), 'the node acts on')}", by,
                   f'[restore] annotations = ["{key}"]')


_ACTED_ON_BY = {
    "org.criu.": "runc hands to CRIU (a configuration file whose action scripts run as root)",
    "org.systemd.property.": "runc makes a systemd unit property",
    "org.opencontainers.runc.": "runc acts on",
    "run.oci.": "crun acts on",
    "io.containerd.": "containerd's shims act on",
    "io.kubernetes.cri.sandbox-id": "containerd's runc shim groups containers by",
    "io.katacontainers.": "Kata acts on (host paths, hypervisor)",
    "io.torpor.restore.": "torpor-runc restore acts on (give the restore option instead)",
}


def _prefix_of(key: str) -> str:
    return next((p for p in ACTED_ON_ANNOTATIONS
                 if (key.startswith(p) if p.endswith((".", "/")) else key == p)), "")


def names_acted_on(key: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """Whether the policy names an annotation the node acts on: by its exact key, or by a
    prefix* pattern within the key's own family (`org.criu.*` names org.criu.config; `org.*`,
    written for inert keys, does not)."""
    family = _prefix_of(key)
    return any(p == key or (p.endswith("*") and key.startswith(p[:-1])
                            and family.endswith((".", "/")) and p[:-1].startswith(family))
               for p in patterns)


def admit_annotations(spec: dict[str, object], policy: RestorePolicy,
                      keep: frozenset[str] = frozenset()) -> list[str]:
    """Drop from `spec` (in place) every inert annotation the policy does not name, except
    those in `keep`; the ones the node acts on stay, for the policy to check. Returns the keys
    dropped."""
    annotations = spec.get("annotations")
    if not isinstance(annotations, dict):
        if annotations is not None:
            spec["annotations"] = {}
        return []
    dropped = [str(k) for k in annotations
               if not acted_on(str(k)) and k not in keep
               and not matches(str(k), policy.annotations)]
    for key in dropped:
        del annotations[key]
    return sorted(dropped)


def archive_limits(cfg: Config) -> ArchiveLimits:
    return ArchiveLimits(max_entries=cfg.restore_max_files,
                         max_bytes=cfg.restore_max_unpacked_bytes)


# The record torpor restore leaves for torpor-runc ----------------------------------------

def write_grant(record_dir: str, requests: SpecRequests) -> str:
    os.makedirs(record_dir, mode=0o700, exist_ok=True)
    path = os.path.join(record_dir, GRANT_FILE)
    write_atomic(path, RestoreGrant(requests, time.time() + GRANT_TTL_S).dumps(), mode=0o600)
    return path


def take_grant(record_dir: str) -> SpecRequests | None:
    """What torpor restore granted this container, removed as it is read; None if nothing."""
    path = os.path.join(record_dir, GRANT_FILE)
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
        os.unlink(path)
    except OSError:
        return None
    try:
        grant = RestoreGrant.loads(data, path)
    except FormatError:
        return None
    return grant.requests if grant.expires >= time.time() else None


def check_in_runtime(requests: SpecRequests, policy: RestorePolicy,
                     granted: SpecRequests | None, sealed_here: bool = False) -> bool:
    """torpor-runc's check: what torpor restore granted, exactly; or requests this node sealed
    at checkpoint time, or a Kubernetes restore (kubelet's spec); or else the policy alone.
    True when the spec is the node's own or granted as it is; False when it passed the policy
    alone (a foreign spec: its inert annotations are then admit_annotations' to drop)."""
    if sealed_here or (granted is not None and granted == requests):
        return True
    check(requests, policy)
    return False


# annotations that act at a restore and at nothing else: an engine's create passes them to runc,
# which ignores them there, and to `runc restore`, which hands org.criu.config to CRIU
RESTORE_ONLY_ANNOTATIONS = ("org.criu.", "io.torpor.restore.")


def check_engine_made(requests: SpecRequests, policy: RestorePolicy) -> None:
    """A spec the engine made for the restored container (kubelet's for a Kubernetes restore,
    ctr's, nerdctl's or kubelet's for a restore on create) is the node's own, as a new
    container's would be, but for what acts only at a restore: an annotation that runc hands
    to CRIU (a configuration file whose action scripts run as root) or that torpor-runc restore
    acts on is the policy's to allow, as in any restore. RestoreError naming each."""
    refused = [v for a in requests.annotations if a.key.startswith(RESTORE_ONLY_ANNOTATIONS)
               for v in (_annotation_verdict(a, policy, UserGrants()),) if not v.allowed_by]
    if refused:
        lines = "\n".join(f"  - {v.what} (allow with: {v.remedy})" for v in refused)
        raise RestoreError("the new container's spec asks, for its restore, for what this "
                           f"node's restore policy does not allow:\n{lines}",
                           hint="drop the annotation, or start the container cold")


CRI_PLUGIN_DIR = "io.containerd.grpc.v1.cri"


def built_by_cri(image_path: str, container_id: str) -> bool:
    """Whether this is a Kubernetes restore: containerd's CRI unpacks the archive under its own
    directory for the new container (`.../io.containerd.grpc.v1.cri/containers/<id>/...`), and
    builds the spec from kubelet's CreateContainer request, not from the checkpoint. No ctr,
    nerdctl or torpor restore can put the image path there."""
    parts = os.path.realpath(image_path).split(os.sep)
    for i, part in enumerate(parts[:-2]):
        if part == CRI_PLUGIN_DIR and parts[i + 1] == "containers" and parts[i + 2] == container_id:
            return True
    return False


ON_CREATE_DIR = "on-create"   # under [runtime] state_dir: torpor-runc create's unpacked checkpoints


def built_for_create(image_path: str, state_dir: str) -> bool:
    """Whether torpor-runc create is restoring (restore on create): it unpacked the checkpoint
    under `<state_dir>/on-create/`, and the spec is the one the engine (ctr, nerdctl, kubelet)
    made for the new container, as a CRI restore's is kubelet's, not the checkpoint's."""
    root = os.path.realpath(os.path.join(state_dir, ON_CREATE_DIR))
    return os.path.realpath(image_path).startswith(root + os.sep)


NODE_KEY = "node.key"  # torpor.capture.node_key.NODE_KEY
SEAL_PREFIX = "hmac-sha256:"


def node_key(cfg: Config, log: Log | None = None) -> bytes:
    """This node's sealing key (torpor.capture.node_key: whole, 32 bytes, or made anew)."""
    from torpor.capture import node_key as node_key_file

    return node_key_file.load(cfg.image_store, log)


def seal(key: bytes, requests: SpecRequests) -> str:
    """An HMAC of the requests (torpor's own hooks are not among them)."""
    import hashlib
    import hmac
    import json

    body = json.dumps(requests.to_json(), sort_keys=True, separators=(",", ":")).encode()
    return SEAL_PREFIX + hmac.new(key, body, hashlib.sha256).hexdigest()


def sealed_here(key: bytes, requests: SpecRequests, recorded: str) -> bool:
    import hmac

    return bool(recorded) and hmac.compare_digest(seal(key, requests), recorded)
