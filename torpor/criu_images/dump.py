"""What a CRIU dump says it will restore, in plain terms: its tasks and threads (credentials,
seccomp, namespaces), the paths its open files and unix sockets reach, its mounts and its ttys.
Read from the images (reader.py); the checks (checks.py) need nothing else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from torpor.criu_images.reader import read_entries, read_one
from torpor.errors import FormatError

NAMESPACES = ("pid", "net", "ipc", "uts", "mnt", "user", "cgroup", "time")
MAX_TASKS = 65536
FSTYPES = {0: "unsupported", 1: "proc", 2: "sysfs", 3: "devtmpfs", 4: "binfmt_misc", 5: "tmpfs",
           6: "devpts", 7: "simfs", 8: "pstore", 9: "securityfs", 10: "fusectl", 11: "debugfs",
           12: "cgroup", 13: "aufs", 14: "mqueue", 15: "fuse", 16: "auto", 17: "overlay",
           18: "autofs", 19: "tracefs", 23: "cgroup2"}
TTY_TYPES = {0: "unknown", 1: "pty", 2: "console", 3: "vt", 4: "ctty", 5: "external tty",
             6: "serial"}
SECCOMP_MODES = {0: "disabled", 1: "strict", 2: "filter"}
TASK_DEAD = 2                              # core_entry.tc.task_state (compel's task-state.h)


@dataclass(frozen=True)
class Creds:
    uids: tuple[int, int, int, int]       # uid, euid, suid, fsuid
    gids: tuple[int, int, int, int]       # gid, egid, sgid, fsgid
    groups: tuple[int, ...]
    caps: dict[str, frozenset[int]]       # "inh", "prm", "eff", "bnd", "amb" -> bit numbers
    secbits: int
    no_new_privs: bool


@dataclass(frozen=True)
class Thread:
    tid: int
    creds: Creds | None
    seccomp: str                           # disabled, strict, filter


@dataclass(frozen=True)
class Task:
    pid: int
    comm: str
    threads: tuple[Thread, ...]
    namespaces: dict[str, int]             # NAMESPACES -> CRIU's id of the namespace
    dead: bool = False                     # a zombie: CRIU restores its exit status, nothing runs

    def describe(self) -> str:
        return f"task {self.pid} ({self.comm})" if self.comm else f"task {self.pid}"


@dataclass(frozen=True)
class Mount:
    mnt_id: int
    fstype: str
    mountpoint: str
    root: str
    source: str
    ext_key: str                           # a mount runc maps from the outside (its key)


@dataclass(frozen=True)
class PathUse:
    what: str                              # "open file", "unix socket bound at"
    path: str
    mnt_id: int                            # -1: not recorded
    file_id: int
    created: bool                          # CRIU makes it on restore (ghost file, socket)


@dataclass(frozen=True)
class Tty:
    file_id: int
    kind: str


@dataclass(frozen=True)
class Dump:
    dumper_namespaces: dict[str, int]      # CRIU's own at dump time: the dumping host's
    tasks: tuple[Task, ...]
    mounts: tuple[Mount, ...]
    paths: tuple[PathUse, ...]
    ttys: tuple[Tty, ...]
    ns_files: tuple[tuple[int, int], ...] = ()   # open namespace files: (file id, namespace id)


def load(directory: str) -> Dump:
    """The dump in CRIU's image directory."""
    inventory = read_one(_path(directory, "inventory.img"), "INVENTORY", "inventory_entry")
    dumper = _ids(inventory.root_ids) if inventory.HasField("root_ids") else {}
    pstree = read_entries(_path(directory, "pstree.img"), "PSTREE", "pstree_entry")
    if not pstree or len(pstree) > MAX_TASKS:
        raise FormatError(f"the CRIU dump lists {len(pstree)} tasks")
    tasks = tuple(_task(directory, entry) for entry in pstree)
    mounts: list[Mount] = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("mountpoints-") and name.endswith(".img"):
            mounts.extend(_mount(m) for m in read_entries(_path(directory, name), "MNTS",
                                                          "mnt_entry"))
    files = _files(directory)
    remapped = _remapped(directory)
    paths = tuple(p for f in files for p in _path_uses(f, remapped))
    ttys = _ttys(directory, files)
    ns_files = tuple((int(f.nsf.id), int(f.nsf.ns_id)) for f in files if f.HasField("nsf"))
    return Dump(dumper, tasks, tuple(mounts), paths, ttys, ns_files)


def _path(directory: str, name: str) -> str:
    return os.path.join(directory, name)


def _ids(ids: Any) -> dict[str, int]:
    return {ns: getattr(ids, f"{ns}_ns_id") for ns in NAMESPACES if ids.HasField(f"{ns}_ns_id")}


def _task(directory: str, entry: Any) -> Task:
    """A pstree entry's task. Its first thread is the leader, whose id is the entry's pid: for a
    zombie CRIU writes there whatever its memory held (0, or any number: criu/pstree.c
    dump_pstree) and reads past it on restore. A zombie has a core image only (criu/cr-dump.c
    dump_one_zombie)."""
    pid = int(entry.pid)
    threads = list(dict.fromkeys([pid, *(int(t) for t in list(entry.threads)[1:])]))
    cores = {tid: read_one(_path(directory, f"core-{tid}.img"), "CORE", "core_entry")
             for tid in threads}
    main = cores[pid]
    comm = str(main.tc.comm) if main.HasField("tc") else ""
    if main.HasField("tc") and main.tc.task_state == TASK_DEAD:
        if len(threads) > 1:
            raise FormatError(f"the CRIU dump's zombie {pid} has {len(threads)} threads")
        return Task(pid, comm, (), {}, dead=True)
    ids = read_one(_path(directory, f"ids-{pid}.img"), "IDS", "task_kobj_ids_entry")
    return Task(pid, comm, tuple(_thread(tid, core) for tid, core in cores.items()), _ids(ids))


def _thread(tid: int, core: Any) -> Thread:
    creds = None
    seccomp = 0
    if core.HasField("thread_core"):
        thread_core = core.thread_core
        if thread_core.HasField("creds"):
            creds = _creds(thread_core.creds)
        seccomp = thread_core.seccomp_mode
    elif core.HasField("tc"):
        seccomp = core.tc.old_seccomp_mode
    return Thread(tid, creds, SECCOMP_MODES.get(int(seccomp), f"mode {seccomp}"))


def _creds(c: Any) -> Creds:
    def bits(words: Any) -> frozenset[int]:
        return frozenset(32 * i + b for i, w in enumerate(words) for b in range(32) if w >> b & 1)

    caps = {name: bits(getattr(c, f"cap_{name}")) for name in ("inh", "prm", "eff", "bnd", "amb")}
    return Creds((c.uid, c.euid, c.suid, c.fsuid), (c.gid, c.egid, c.sgid, c.fsgid),
                 tuple(c.groups), caps, int(c.secbits), bool(c.no_new_privs))


def _mount(m: Any) -> Mount:
    return Mount(int(m.mnt_id), FSTYPES.get(int(m.fstype), f"type {m.fstype}"),
                 str(m.mountpoint), str(m.root), str(m.source),
                 str(m.ext_key) if m.HasField("ext_key") else "")


# the per-kind file images of older CRIUs, which CRIU still reads: file_entry's field for each
LEGACY_FILES = (("reg-files.img", "REG_FILES", "reg_file_entry", "reg"),
                ("unixsk.img", "UNIXSK", "unix_sk_entry", "usk"),
                ("tty.img", "TTY_FILES", "tty_file_entry", "tty"),
                ("ns-files.img", "NS_FILES", "ns_file_entry", "nsf"))


def _files(directory: str) -> list[Any]:
    from torpor.criu_images.reader import definitions

    path = _path(directory, "files.img")
    files = read_entries(path, "FILES", "file_entry") if os.path.exists(path) else []
    for name, magic, message, field in LEGACY_FILES:
        legacy = _path(directory, name)
        if os.path.exists(legacy):
            pb = definitions()[0]
            for entry in read_entries(legacy, magic, message):
                wrapped = pb.file_entry()
                getattr(wrapped, field).CopyFrom(entry)
                files.append(wrapped)
    return files


def _remapped(directory: str) -> set[int]:
    path = _path(directory, "remap-fpath.img")
    if not os.path.exists(path):
        return set()
    return {int(r.orig_id) for r in read_entries(path, "REMAP_FPATH", "remap_file_path_entry")}


def _path_uses(f: Any, remapped: set[int]) -> list[PathUse]:
    if f.HasField("reg"):
        reg = f.reg
        mnt_id = int(reg.mnt_id) if reg.HasField("mnt_id") else -1
        return [PathUse("open file", str(reg.name), mnt_id, int(reg.id), int(reg.id) in remapped)]
    if f.HasField("usk"):
        usk = f.usk
        name = bytes(usk.name)
        if not name or name.startswith(b"\0"):   # unbound or abstract: no path
            return []
        path = name.rstrip(b"\0").decode("utf-8", "surrogateescape")
        if not path.startswith("/") and usk.HasField("name_dir"):
            path = f"{usk.name_dir.rstrip('/')}/{path}"
        mnt_id = int(usk.mnt_id) if usk.HasField("mnt_id") else -1
        return [PathUse("unix socket bound at", path, mnt_id, int(usk.id), True)]
    return []


def _ttys(directory: str, files: list[Any]) -> tuple[Tty, ...]:
    ttys = [f.tty for f in files if f.HasField("tty")]
    if not ttys:
        return ()
    path = _path(directory, "tty-info.img")
    infos = ({int(i.id): int(i.type) for i in read_entries(path, "TTY_INFO", "tty_info_entry")}
             if os.path.exists(path) else {})
    return tuple(Tty(int(t.id), TTY_TYPES.get(infos.get(int(t.tty_info_id), 0), "unknown"))
                 for t in ttys)
