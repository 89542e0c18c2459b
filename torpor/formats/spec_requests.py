"""What a checkpoint's OCI runtime spec asks of the node that restores it: the root path, hooks,
host mounts, devices, capabilities beyond the defaults, namespaces shared with the host or joined
by path, and the cgroup path. `torpor inspect` shows it; `torpor restore` checks it against the
node's policy (torpor.capture.restore_policy) and leaves what it granted for torpor-runc in a
grant record (`<state_dir>/restore-work/<restore>/restore-grant.json`, in the work directory
of that one restore). Stdlib only.

torpor's own hooks (args[0] "torpor-hook") at createRuntime and poststop are not requests:
torpor-runc replaces them with this node's own, whatever path the checkpoint gave them. A hook
that calls itself torpor's at any other stage is a request like any other hook (and torpor-runc
removes it): what a hook calls itself proves nothing.

Annotations that something on the node acts on (ACTED_ON: runc hands org.criu.config to CRIU,
whose action scripts run as root; runc turns org.systemd.property.* into systemd unit
properties; crun reads run.oci.*; containerd's shims read io.containerd.*; torpor reads
io.torpor.restore.*) are requests too, key and value. Any other annotation is inert and only
travels where the node's `[restore] annotations` names it (torpor.capture.restore_policy).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from torpor.errors import FormatError
from torpor.formats.fields import Fields, check_format
from torpor.formats.flat import from_flat, to_flat
from torpor.formats.oci import OciSpec

GRANT_FORMAT = "torpor.restore-grant.v1"
GRANT_FILE = "restore-grant.json"
TORPOR_HOOK_ARG0 = "torpor-hook"   # shim.modifiers.HOOK_MARKER
TORPOR_HOOK_STAGES = ("createRuntime", "poststop")  # shim.modifiers.HOOK_NAMES: replaced there
# Annotation keys (a trailing "." or "/" is a prefix) that runc, CRIU, the shims, crun, Kata or
# torpor act on: each one is a request the node's policy must name.
ACTED_ON_ANNOTATIONS = (
    "org.criu.",                      # runc: org.criu.config, CRIU's configuration file
    "org.systemd.property.",          # runc (systemd cgroups): unit properties
    "org.opencontainers.runc.",       # runc's own (exec CPU affinity...)
    "run.oci.",                       # crun: hooks output, keep original groups, seccomp...
    "io.containerd.",                 # containerd's shims: grouping, runtime options
    "io.kubernetes.cri.sandbox-id",   # containerd's runc shim groups containers by it
    "io.katacontainers.",             # Kata: hypervisor, kernel, paths on the host
    "io.torpor.restore.",             # torpor-runc restore: add addresses to a namespace
)
NAMESPACES = ("mount", "pid", "ipc", "uts", "network")  # a container has its own of each
# what a mount of these types exposes is the container's own, not the host's
CONTAINER_FILESYSTEMS = ("proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2", "shm")
# containerd's and Docker's default capability set
DEFAULT_CAPABILITIES = frozenset({
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"})


@dataclass(frozen=True)
class Hook:
    stage: str
    path: str
    args: str         # the argv, space-joined, for messages


@dataclass(frozen=True)
class HostMount:
    destination: str
    source: str
    type: str
    read_only: bool


@dataclass(frozen=True)
class Device:
    """A device node in linux.devices ("c"/"b"/"u"/"p"), or an allow rule of
    linux.resources.devices ("a" for all; -1 for a wildcard number)."""

    kind: str
    major: int
    minor: int
    path: str = ""        # a node's path; "" for a cgroup rule
    access: str = ""      # a rule's access ("rwm")

    def describe(self) -> str:
        number = f"{'*' if self.major < 0 else self.major}:{'*' if self.minor < 0 else self.minor}"
        what = f"{self.kind} {number}"
        return f"device {self.path} ({what})" if self.path else f"access to devices {what} " \
            f"({self.access or 'rwm'})"


@dataclass(frozen=True)
class Namespace:
    type: str
    path: str          # "" when the spec has no namespace of this type: the host's is shared


@dataclass(frozen=True)
class Annotation:
    key: str
    value: str


def acted_on(key: str) -> bool:
    """Whether something on a node acts on the annotation `key` (ACTED_ON_ANNOTATIONS)."""
    return any(key.startswith(p) if p.endswith((".", "/")) else key == p
               for p in ACTED_ON_ANNOTATIONS)


def matches(key: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """`key` against `[restore] annotations` patterns: exact keys, or `prefix*`."""
    return any(key.startswith(p[:-1]) if p.endswith("*") else key == p for p in patterns)


@dataclass(frozen=True)
class SpecRequests:
    root_path: str = "rootfs"
    hooks: tuple[Hook, ...] = ()
    host_mounts: tuple[HostMount, ...] = ()
    devices: tuple[Device, ...] = ()
    capabilities: tuple[str, ...] = ()        # beyond DEFAULT_CAPABILITIES
    namespaces: tuple[Namespace, ...] = ()    # joined by path, or shared with the host
    cgroups_path: str = ""
    annotations: tuple[Annotation, ...] = ()  # the ACTED_ON ones

    @classmethod
    def of(cls, spec: OciSpec) -> SpecRequests:
        """Read a spec, whatever shape it is in: odd values are requests too, never crashes."""
        root, linux, process = _obj(spec.get("root")), _obj(spec.get("linux")), \
            _obj(spec.get("process"))
        return cls(root_path=str(root.get("path", "rootfs")), hooks=_hooks(spec.get("hooks")),
                   host_mounts=_mounts(spec.get("mounts")),
                   devices=_devices(linux), capabilities=_capabilities(process),
                   namespaces=_namespaces(linux.get("namespaces")),
                   cgroups_path=str(linux.get("cgroupsPath") or ""),
                   annotations=_annotations(spec.get("annotations")))

    def to_json(self) -> dict[str, Any]:
        out = {"root_path": self.root_path, "hooks": [to_flat(h) for h in self.hooks],
               "host_mounts": [to_flat(m) for m in self.host_mounts],
               "devices": [to_flat(d) for d in self.devices],
               "capabilities": list(self.capabilities),
               "namespaces": [to_flat(n) for n in self.namespaces],
               "cgroups_path": self.cgroups_path}
        if self.annotations:  # absent when none: seals made before annotations still match
            out["annotations"] = [to_flat(a) for a in self.annotations]
        return out

    @classmethod
    def from_json(cls, f: Fields) -> SpecRequests:
        return cls(root_path=f.string("root_path"),
                   hooks=tuple(from_flat(Hook, x) for x in f.children("hooks")),
                   host_mounts=tuple(from_flat(HostMount, x) for x in f.children("host_mounts")),
                   devices=tuple(from_flat(Device, x) for x in f.children("devices")),
                   capabilities=tuple(f.strings("capabilities")),
                   namespaces=tuple(from_flat(Namespace, x) for x in f.children("namespaces")),
                   cgroups_path=f.string("cgroups_path", ""),
                   annotations=tuple(from_flat(Annotation, x) for x in f.children("annotations")))


@dataclass(frozen=True)
class RestoreGrant:
    """What `torpor restore` checked and granted, for torpor-runc restore of that container."""

    requests: SpecRequests
    expires: float

    def dumps(self) -> bytes:
        return json.dumps({"format": GRANT_FORMAT, "requests": self.requests.to_json(),
                           "expires": self.expires}, sort_keys=True).encode()

    @classmethod
    def loads(cls, data: bytes, what: str) -> RestoreGrant:
        try:
            f = Fields(json.loads(data), what)
        except ValueError as e:
            raise FormatError(f"{what} is not valid JSON: {e}") from None
        check_format(f, GRANT_FORMAT)
        return cls(SpecRequests.from_json(f.child("requests")), f.number("expires"))


def _hooks(hooks: object) -> tuple[Hook, ...]:
    found: list[Hook] = []
    if not isinstance(hooks, dict):
        return ()
    for stage, entries in sorted(hooks.items()):
        for entry in entries if isinstance(entries, list) else [entries]:
            if not isinstance(entry, dict):
                found.append(Hook(str(stage), repr(entry), ""))
                continue
            args = _list(entry.get("args"))
            if args and args[0] == TORPOR_HOOK_ARG0 and stage in TORPOR_HOOK_STAGES:
                continue
            found.append(Hook(str(stage), str(entry.get("path", "")),
                              " ".join(str(a) for a in args)))
    return tuple(found)


def _annotations(annotations: object) -> tuple[Annotation, ...]:
    if not isinstance(annotations, dict):
        return ()
    return tuple(Annotation(str(k), str(v)) for k, v in sorted(annotations.items(), key=str)
                 if acted_on(str(k)))


def is_bind(mount: dict[str, Any]) -> bool:
    options = _list(mount.get("options"))
    return mount.get("type") == "bind" or "bind" in options or "rbind" in options


def _mounts(mounts: object) -> tuple[HostMount, ...]:
    found = []
    for mount in _list(mounts):
        if not isinstance(mount, dict):
            continue
        kind = str(mount.get("type") or "")
        if not is_bind(mount) and kind in CONTAINER_FILESYSTEMS:
            continue
        options = _list(mount.get("options"))
        found.append(HostMount(str(mount.get("destination", "")), str(mount.get("source", "")),
                               "bind" if is_bind(mount) else kind, "ro" in options))
    return tuple(found)


def _number(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _devices(linux: dict[str, Any]) -> tuple[Device, ...]:
    found = [Device(str(d.get("type", "?")), _number(d.get("major")), _number(d.get("minor")),
                    path=str(d.get("path", "")))
             for d in _list(linux.get("devices")) if isinstance(d, dict)]
    for rule in _list(_obj(linux.get("resources")).get("devices")):
        if isinstance(rule, dict) and rule.get("allow") is not False:
            found.append(Device(str(rule.get("type") or "a"), _number(rule.get("major")),
                                _number(rule.get("minor")), access=str(rule.get("access", ""))))
    return tuple(found)


def _capabilities(process: dict[str, Any]) -> tuple[str, ...]:
    names: set[str] = set()
    for values in _obj(process.get("capabilities")).values():
        names.update(str(v) for v in _list(values))
    return tuple(sorted(names - DEFAULT_CAPABILITIES))


def _namespaces(namespaces: object) -> tuple[Namespace, ...]:
    present: dict[str, str] = {}
    for ns in _list(namespaces):
        if isinstance(ns, dict):
            present[str(ns.get("type", ""))] = str(ns.get("path") or "")
    found = [Namespace(kind, path) for kind, path in sorted(present.items()) if path]
    found += [Namespace(kind, "") for kind in NAMESPACES if kind not in present]
    return tuple(found)


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
