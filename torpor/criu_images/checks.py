"""A CRIU dump (dump.py) against the spec it is restored with and the node's policy: what each
task would come back as, in words, when the spec does not grant it.

- credentials, every thread: its capability sets (inheritable, permitted, effective, bounding,
  ambient) within the spec's bounding set (no process of the container can hold more); when the
  spec's user is not root, no_new_privs is on and the spec grants no CAP_SETUID (CAP_SETGID),
  the uids (gids) are the spec's user's and the permitted and effective sets within the spec's
  permitted set, the supplementary groups the spec's; securebits beyond keep-caps only where the
  spec's bounding set holds CAP_SETPCAP; no_new_privs on where the spec says so (the kernel
  never clears it); seccomp in filter mode where the spec has a seccomp profile (the filters
  themselves are CRIU's to restore, and not compared with the spec's);
- namespaces: every task in a namespace of its own of each kind the spec gives the container
  (its own or one it joins), not in the dumping CRIU's (the dumping host's), unless `[restore]
  host_namespaces` names the kind; no user namespace the spec does not have;
- paths: each open file and bound unix socket on a mount of the dump, below that mount's
  mountpoint, absolute and without `..`;
- mounts: the root, the spec's mounts and masked paths, and filesystems that are the
  container's own (proc, sysfs, tmpfs, devpts, mqueue, cgroup); runc's cgroup v1 hierarchies
  below the spec's cgroup mount; any other filesystem, or a mount runc is to map from outside
  at a place the spec has no mount, is a finding;
- ttys: only with a terminal in the spec, and only pseudo-terminals or runc's console;
- open namespace files (nsfs): none of the dumping host's namespaces, unless `[restore]
  host_namespaces` names the kind.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass

from torpor.criu_images.dump import Dump, Mount, PathUse, Task, Thread
from torpor.errors import FormatError
from torpor.formats.oci import OciSpec

CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
    "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
    "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE")
CAP_SETGID, CAP_SETUID, CAP_SETPCAP = 6, 7, 8
SECBIT_KEEP_CAPS = 1 << 4
SET_NAMES = {"inh": "inheritable", "prm": "permitted", "eff": "effective", "bnd": "bounding",
             "amb": "ambient"}
SPEC_NAMESPACES = {"pid": "pid", "net": "network", "ipc": "ipc", "uts": "uts", "mnt": "mount",
                   "user": "user", "cgroup": "cgroup", "time": "time"}
OWN_FILESYSTEMS = frozenset({"proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2"})
TERMINALS = frozenset({"pty", "external tty"})


@dataclass(frozen=True)
class Finding:
    what: str      # in words: what the image would restore
    remedy: str    # what would allow it, or "none: ..."


@dataclass(frozen=True)
class SpecView:
    """What the spec grants the container's processes."""

    uid: int
    gid: int
    groups: frozenset[int]
    caps: dict[str, frozenset[int]]     # bounding, effective, inheritable, permitted, ambient
    no_new_privs: bool
    seccomp: bool
    terminal: bool
    namespaces: frozenset[str]          # the spec's namespace types (own or joined)
    mount_points: frozenset[str]        # mount destinations and masked paths
    cgroup_points: frozenset[str] = frozenset()   # destinations of the spec's cgroup mounts

    @classmethod
    def of(cls, spec: OciSpec) -> SpecView:
        try:
            return cls._of(spec)
        except (TypeError, ValueError, AttributeError) as e:
            raise FormatError(f"the spec's process, mounts or namespaces are malformed: {e}") \
                from None

    @classmethod
    def _of(cls, spec: OciSpec) -> SpecView:
        process = spec.get("process") or {}
        user = process.get("user") or {}
        linux = spec.get("linux") or {}
        caps_doc = process.get("capabilities")
        caps: dict[str, frozenset[int]] = {}
        for kind in ("bounding", "effective", "inheritable", "permitted", "ambient"):
            if caps_doc is None:   # runc then leaves the capabilities as they are: all
                caps[kind] = frozenset(range(len(CAPABILITIES)))
            else:
                names = caps_doc.get(kind) or []
                caps[kind] = frozenset(CAPABILITIES.index(n) for n in names if n in CAPABILITIES)
        points = {_normal(str(m.get("destination", ""))) for m in spec.get("mounts") or []}
        points |= {_normal(str(p)) for p in linux.get("maskedPaths") or []}
        cgroups = {_normal(str(m.get("destination", ""))) for m in spec.get("mounts") or []
                   if m.get("type") in ("cgroup", "cgroup2")}
        return cls(int(user.get("uid", 0)), int(user.get("gid", 0)),
                   frozenset(int(g) for g in user.get("additionalGids") or []) | {int(
                       user.get("gid", 0))}, caps, bool(process.get("noNewPrivileges")),
                   bool(linux.get("seccomp")), bool(process.get("terminal")),
                   frozenset(str(n.get("type")) for n in linux.get("namespaces") or []),
                   frozenset(points), frozenset(cgroups))


def findings(dump: Dump, spec: OciSpec, host_namespaces: Iterable[str] = ()) -> list[Finding]:
    """Everything the dump would restore that the spec (and the policy) does not grant."""
    view = SpecView.of(spec)
    host_namespaces = frozenset(host_namespaces)
    out: list[Finding] = []
    for task in dump.tasks:
        for thread in task.threads:
            out.extend(_thread_findings(task, thread, view))
        out.extend(_namespace_findings(task, dump.dumper_namespaces, view, host_namespaces))
    mounts = {m.mnt_id: m for m in dump.mounts}
    for mount in dump.mounts:
        out.extend(_mount_findings(mount, view))
    for use in dump.paths:
        out.extend(_path_findings(use, mounts))
    host_ids = {ns_id: SPEC_NAMESPACES[ns] for ns, ns_id in dump.dumper_namespaces.items()}
    for file_id, ns_id in dump.ns_files:
        if ns_id in host_ids and host_ids[ns_id] not in host_namespaces:
            out.append(Finding(f"an open file (file {file_id}) of the dumping host's "
                               f"{host_ids[ns_id]} namespace",
                               f'[restore] host_namespaces = ["{host_ids[ns_id]}"]'))
    for tty in dump.ttys:
        if not view.terminal or tty.kind not in TERMINALS:
            out.append(Finding(f"a terminal ({tty.kind}, file {tty.file_id})",
                               "none: the spec has no terminal" if not view.terminal else
                               "none: only pseudo-terminals are restored"))
    return _unique(out)


def _thread_findings(task: Task, thread: Thread, view: SpecView) -> list[Finding]:
    who = task.describe() if thread.tid == task.pid else f"{task.describe()} thread {thread.tid}"
    out: list[Finding] = []
    if view.seccomp and thread.seccomp != "filter":
        out.append(Finding(f"{who} without the spec's seccomp filter (seccomp {thread.seccomp})",
                           "none: the spec's processes run filtered"))
    creds = thread.creds
    if creds is None:
        return [*out, Finding(f"{who} without credentials in its core image",
                              "none: CRIU's images of this version record them")]
    bounding = view.caps["bounding"]
    beyond: dict[frozenset[int], list[str]] = {}
    for short, caps in creds.caps.items():
        limit = bounding | view.caps["inheritable"] if short == "inh" else bounding
        if caps - limit:
            beyond.setdefault(frozenset(caps - limit), []).append(SET_NAMES[short])
    for extra, sets in beyond.items():
        out.append(Finding(f"{who} with {_words(sets)} capabilities beyond the spec's bounding "
                           f"set: {_cap_names(extra)}",
                           "none: a process cannot hold more than its bounding set; "
                           "the spec's capabilities are what [restore] capabilities allows"))
    non_root = view.uid != 0 and view.no_new_privs
    if non_root:
        permitted = view.caps["permitted"]
        for short in ("prm", "eff"):
            extra = creds.caps[short] - permitted
            if extra and CAP_SETUID not in permitted:
                out.append(Finding(f"{who} with {SET_NAMES[short]} capabilities the spec's user "
                                   f"{view.uid} cannot have: {_cap_names(extra)}",
                                   "none: without new privileges it can only drop them"))
        if CAP_SETUID not in permitted and set(creds.uids) != {view.uid}:
            out.append(Finding(f"{who} as uids {_ids(creds.uids)} (real, effective, saved, fs): "
                               f"the spec's user is {view.uid}",
                               "none: without CAP_SETUID and new privileges it cannot change"))
        if CAP_SETGID not in permitted and (set(creds.gids) != {view.gid}
                                            or not set(creds.groups) <= view.groups):
            out.append(Finding(f"{who} as gids {_ids(creds.gids)} with groups "
                               f"{_ids(creds.groups) or 'none'}: the spec's are {view.gid} and "
                               f"{_ids(sorted(view.groups))}",
                               "none: without CAP_SETGID and new privileges they cannot change"))
    if view.no_new_privs and not creds.no_new_privs:
        out.append(Finding(f"{who} without no_new_privs, which the spec sets",
                           "none: the kernel never clears it"))
    if creds.secbits & ~SECBIT_KEEP_CAPS and CAP_SETPCAP not in bounding:
        out.append(Finding(f"{who} with securebits {creds.secbits:#x}",
                           "none: setting them needs CAP_SETPCAP, which the spec does not grant"))
    return out


def _namespace_findings(task: Task, dumper: dict[str, int], view: SpecView,
                        host_allowed: frozenset[str]) -> list[Finding]:
    out: list[Finding] = []
    for ns, spec_name in SPEC_NAMESPACES.items():
        mine = task.namespaces.get(ns)
        if mine is None or ns not in dumper:
            continue
        shares = mine == dumper[ns]
        if spec_name in view.namespaces and shares and spec_name not in host_allowed:
            out.append(Finding(f"{task.describe()} in the dumping host's {spec_name} namespace, "
                               "where the spec gives the container its own",
                               f'[restore] host_namespaces = ["{spec_name}"]'))
        if ns == "user" and not shares and "user" not in view.namespaces:
            out.append(Finding(f"{task.describe()} in a user namespace of the checkpoint's "
                               "making (its uid mappings), which the spec does not have",
                               "none: user namespaces come from the spec"))
    return out


def _mount_findings(mount: Mount, view: SpecView) -> list[Finding]:
    point = mount.mountpoint
    if not _clean(point):
        return [Finding(f"a mount at {point!r}", "none: a mountpoint is absolute, without '..'")]
    point = _normal(point)
    if point == "/" or point in view.mount_points:
        return []
    if mount.ext_key and any(point.startswith(c.rstrip("/") + "/") for c in view.cgroup_points):
        return []   # runc's own cgroup v1 hierarchies, below the spec's cgroup mount
    if mount.ext_key:
        return [Finding(f"a mount runc is to bring from outside ({mount.ext_key!r}) at {point}, "
                        "where the spec has no mount",
                        "--volume, or a mount in the spec: the spec's mounts are policy-checked")]
    if mount.fstype in OWN_FILESYSTEMS:
        return []
    return [Finding(f"a {mount.fstype} mount of {mount.source!r} (its {mount.root!r}) at "
                    f"{point}, which the spec does not have",
                    "none: only the spec's mounts and the container's own filesystems")]


def _path_findings(use: PathUse, mounts: dict[int, Mount]) -> list[Finding]:
    if not _clean(use.path):
        return [Finding(f"{use.what} {use.path!r}", "none: a path is absolute, without '..'")]
    if use.mnt_id < 0 or not mounts:
        return []   # no mount recorded: the rootfs check (rootfs.py) decides
    mount = mounts.get(use.mnt_id)
    if mount is None:
        return [Finding(f"{use.what} {use.path} on mount {use.mnt_id}, which the dump does not "
                        "have", "none: a file is on one of the container's mounts")]
    point = _normal(mount.mountpoint)
    path = _normal(use.path)
    if point != "/" and path != point and not path.startswith(point + "/"):
        return [Finding(f"{use.what} {use.path}, outside the mount it is on ({point})",
                        "none: a file lies below its mount's mountpoint")]
    return []


def _clean(path: str) -> bool:
    return path.startswith("/") and ".." not in path.split("/") and "\0" not in path


def _normal(path: str) -> str:
    return posixpath.normpath(path) if path.startswith("/") else path


def _cap_names(bits: Iterable[int]) -> str:
    return ", ".join(CAPABILITIES[b] if b < len(CAPABILITIES) else f"capability {b}"
                     for b in sorted(bits))


def _words(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _ids(ids: Iterable[int]) -> str:
    return "/".join(str(i) for i in ids)


def _unique(found: list[Finding]) -> list[Finding]:
    return list(dict.fromkeys(found))
