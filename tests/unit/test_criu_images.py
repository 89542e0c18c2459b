"""CRIU's images against the spec (torpor.criu_images): small dumps written with CRIU's own
pycriu (its image writer and message classes), read back by torpor's reader, and checked; the
checks on plain dumps; refusals in words; the rootfs resolution that never leaves the rootfs."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from torpor.config import Config
from torpor.criu_images import checks, dump, reader, rootfs
from torpor.criu_images.checks import CAPABILITIES
from torpor.errors import FormatError, RestoreError

DEFAULT_CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
                "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
                "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]
SPEC: dict[str, Any] = {   # ctr run's spec, in short
    "root": {"path": "rootfs"},
    "process": {"user": {"uid": 0, "gid": 0, "additionalGids": [0]}, "noNewPrivileges": True,
                "capabilities": {k: list(DEFAULT_CAPS) for k in
                                 ("bounding", "effective", "permitted")}},
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
               {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
               {"destination": "/data", "type": "bind", "source": "/srv/volume"}],
    "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
              "maskedPaths": ["/proc/keys"]},
}
HOST = {"pid": 1, "net": 2, "ipc": 3, "uts": 4, "mnt": 6, "user": 7, "cgroup": 8, "time": 5}
OWN = {**HOST, "pid": 9, "net": 10, "ipc": 11, "uts": 12, "mnt": 13}
KOBJ = {"vm_id": 1, "files_id": 1, "fs_id": 1, "sighand_id": 1}


def ids_of(namespaces: dict[str, int]) -> dict[str, int]:
    return {**KOBJ, **{f"{k}_ns_id": v for k, v in namespaces.items()}}


def words(bits: list[str]) -> list[int]:
    """CRIU's u32 words of a capability set."""
    mask = sum(1 << CAPABILITIES.index(b) for b in bits)
    return [mask & 0xFFFFFFFF, mask >> 32]


def creds(**changes: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"uid": 0, "gid": 0, "euid": 0, "egid": 0, "suid": 0, "sgid": 0,
                         "fsuid": 0, "fsgid": 0, "cap_inh": [0, 0],
                         "cap_prm": words(DEFAULT_CAPS), "cap_eff": words(DEFAULT_CAPS),
                         "cap_bnd": words(DEFAULT_CAPS), "secbits": 0, "groups": [0],
                         "no_new_privs": 1, "cap_amb": [0, 0]}
    c.update(changes)
    return c


def core(comm: str, **cred_changes: Any) -> dict[str, Any]:
    return {"mtype": "X86_64", "tc": {"task_state": 1, "exit_code": 0, "personality": 0,
                                      "flags": 0, "blk_sigset": 0, "comm": comm},
            "thread_core": {"futex_rla": 0, "futex_rla_len": 0, "creds": creds(**cred_changes)}}


def mnt(mnt_id: int, fstype: int, point: str, source: str = "x", **extra: Any) -> dict[str, Any]:
    return {"fstype": fstype, "mnt_id": mnt_id, "root_dev": 0, "parent_mnt_id": 1, "flags": 0,
            "root": "/", "mountpoint": point, "source": source, "options": "", **extra}


GENUINE: dict[str, Any] = {
    "inventory": {"img_version": 2, "root_ids": ids_of(HOST)},
    "pstree": [{"pid": 1, "ppid": 0, "pgid": 1, "sid": 1, "threads": [1, 2]}],
    "cores": {1: core("kvserver"), 2: core("kvserver")},
    "ids": {1: ids_of(OWN)},
    "mounts": [mnt(76, 17, "/", "overlay"), mnt(77, 1, "/proc", "proc"),
               mnt(78, 5, "/dev", "tmpfs"), mnt(79, 5, "/proc/keys", ext_key="/dev/null"),
               mnt(80, 0, "/data", "/dev/sda1", ext_key="/data")],
    "files": [{"type": "REG", "id": 1, "reg": {"id": 1, "flags": 0, "pos": 0, "fown": FOWN,
                                               "name": "/bin/kvserver", "mnt_id": 76}}
              for FOWN in [{"uid": 0, "euid": 0, "signum": 0, "pid_type": 0, "pid": 0}]],
}


def write(directory: Path, d: dict[str, Any]) -> Path:
    """A CRIU image directory, written by pycriu's own image writer."""
    images = pytest.importorskip("pycriu.images")

    def put(name: str, magic: str, entries: list[dict[str, Any]]) -> None:
        with open(directory / name, "wb") as f:
            images.dump({"magic": magic, "entries": entries}, f)

    directory.mkdir(exist_ok=True)
    put("inventory.img", "INVENTORY", [d["inventory"]])
    put("pstree.img", "PSTREE", d["pstree"])
    for tid, entry in d["cores"].items():
        put(f"core-{tid}.img", "CORE", [entry])
    for pid, entry in d["ids"].items():
        put(f"ids-{pid}.img", "IDS", [entry])
    put("mountpoints-13.img", "MNTS", d["mounts"])
    put("files.img", "FILES", d["files"])
    if "ttys" in d:
        put("tty-info.img", "TTY_INFO", d["ttys"])
    return directory


def found(tmp_path: Path, change: Any = None, spec: dict[str, Any] | None = None,
          host_namespaces: tuple[str, ...] = ()) -> list[str]:
    d = copy.deepcopy(GENUINE)
    if change:
        change(d)
    loaded = dump.load(str(write(tmp_path / "criu", d)))
    return [f.what for f in checks.findings(loaded, spec or SPEC, host_namespaces)]


def test_a_genuine_dump_has_no_findings(tmp_path: Path) -> None:
    loaded = dump.load(str(write(tmp_path / "criu", GENUINE)))
    assert [t.pid for t in loaded.tasks] == [1]
    assert [th.tid for th in loaded.tasks[0].threads] == [1, 2]
    assert loaded.tasks[0].threads[0].creds is not None
    assert loaded.paths[0].path == "/bin/kvserver"
    assert checks.findings(loaded, SPEC) == []


def test_every_capability_set_of_every_thread_within_the_bounding_set(tmp_path: Path) -> None:
    def all_caps(d: dict[str, Any]) -> None:
        d["cores"][2] = core("kvserver", cap_prm=[0xFFFFFFFF, 0x1FF], cap_amb=words(
            ["CAP_SYS_ADMIN"]), cap_bnd=[0xFFFFFFFF, 0x1FF], cap_eff=[0xFFFFFFFF, 0x1FF])
    what = found(tmp_path, all_caps)
    assert len(what) == 2, what
    assert what[0].startswith("task 1 (kvserver) thread 2 with permitted, effective and bounding "
                              "capabilities beyond the spec's bounding set: CAP_DAC_READ_SEARCH")
    assert "CAP_CHECKPOINT_RESTORE" in what[0]
    assert what[1] == ("task 1 (kvserver) thread 2 with ambient capabilities beyond the spec's "
                       "bounding set: CAP_SYS_ADMIN")


def test_a_non_root_spec_user_is_held_to_its_uids_gids_and_permitted_set(tmp_path: Path) -> None:
    user = json.loads(json.dumps(SPEC))
    user["process"]["user"] = {"uid": 1000, "gid": 1000}
    user["process"]["capabilities"].update(permitted=[], effective=[])
    what = found(tmp_path, spec=user)
    assert "task 1 (kvserver) as uids 0/0/0/0 (real, effective, saved, fs): the spec's user is " \
           "1000" in what
    assert "task 1 (kvserver) as gids 0/0/0/0 with groups 0: the spec's are 1000 and 1000" in what
    assert any(w.startswith("task 1 (kvserver) with permitted capabilities the spec's user 1000 "
                            "cannot have: CAP_CHOWN") for w in what)

    def as_1000(d: dict[str, Any]) -> None:
        ids = dict(uid=1000, euid=1000, suid=1000, fsuid=1000, gid=1000, egid=1000, sgid=1000,
                   fsgid=1000, groups=[1000], cap_prm=[0, 0], cap_eff=[0, 0])
        d["cores"] = {1: core("kvserver", **ids), 2: core("kvserver", **ids)}
    assert found(tmp_path, as_1000, spec=user) == []
    # a spec that leaves the user CAP_SETUID lets it change its uids
    user["process"]["capabilities"]["permitted"] = ["CAP_SETUID", "CAP_SETGID"]
    assert not any("as uids" in w or "as gids" in w for w in found(tmp_path, spec=user))


def test_no_new_privs_seccomp_and_securebits(tmp_path: Path) -> None:
    no_setpcap = words([c for c in DEFAULT_CAPS if c != "CAP_SETPCAP"])
    caps = {"cap_prm": no_setpcap, "cap_eff": no_setpcap, "cap_bnd": no_setpcap}

    def loosened(d: dict[str, Any]) -> None:
        d["cores"] = {1: core("kvserver", no_new_privs=0, secbits=0x2f, **caps),
                      2: core("kvserver", **caps)}
        d["cores"][1]["thread_core"]["seccomp_mode"] = "disabled"
    filtered = json.loads(json.dumps(SPEC))
    filtered["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ERRNO"}
    filtered["process"]["capabilities"]["bounding"].remove("CAP_SETPCAP")
    what = found(tmp_path, loosened, spec=filtered)
    assert what == ["task 1 (kvserver) without the spec's seccomp filter (seccomp disabled)",
                    "task 1 (kvserver) without no_new_privs, which the spec sets",
                    "task 1 (kvserver) with securebits 0x2f",
                    "task 1 (kvserver) thread 2 without the spec's seccomp filter "
                    "(seccomp disabled)"]

    def filter_mode(d: dict[str, Any]) -> None:
        d["cores"] = {1: core("kvserver", **caps), 2: core("kvserver", **caps)}
        for c in d["cores"].values():
            c["thread_core"]["seccomp_mode"] = "filter"
    assert found(tmp_path, filter_mode, spec=filtered) == []


def test_namespaces_are_the_containers_own(tmp_path: Path) -> None:
    def host_mnt_and_userns(d: dict[str, Any]) -> None:
        d["ids"][1].update(mnt_ns_id=HOST["mnt"], net_ns_id=HOST["net"], user_ns_id=99)
    what = found(tmp_path, host_mnt_and_userns)
    assert what == [
        "task 1 (kvserver) in the dumping host's network namespace, where the spec gives the "
        "container its own",
        "task 1 (kvserver) in the dumping host's mount namespace, where the spec gives the "
        "container its own",
        "task 1 (kvserver) in a user namespace of the checkpoint's making (its uid mappings), "
        "which the spec does not have"]
    allowed = found(tmp_path, host_mnt_and_userns, host_namespaces=("network",))
    assert not any("network namespace" in w for w in allowed)


def test_mounts_only_the_root_the_specs_and_the_containers_own(tmp_path: Path) -> None:
    def host_mounts(d: dict[str, Any]) -> None:
        d["mounts"] += [mnt(90, 0, "/host", "/dev/sda1", ext_key="/"),
                        mnt(91, 16, "/disk", "/dev/sda1"), mnt(92, 5, "/../x"),
                        mnt(93, 12, "/sys/fs/cgroup", "cgroup")]
    cgroup_v1 = json.loads(json.dumps(SPEC))
    cgroup_v1["mounts"].append({"destination": "/sys/fs/cgroup", "type": "cgroup",
                                "source": "cgroup"})

    def runc_cgroup_mounts(d: dict[str, Any]) -> None:
        d["mounts"].append(mnt(94, 0, "/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory",
                               ext_key="/sys/fs/cgroup/memory"))
    assert found(tmp_path, runc_cgroup_mounts, spec=cgroup_v1) == []
    assert found(tmp_path, runc_cgroup_mounts) != []
    assert found(tmp_path, host_mounts) == [
        "a mount runc is to bring from outside ('/') at /host, where the spec has no mount",
        "a auto mount of '/dev/sda1' (its '/') at /disk, which the spec does not have",
        "a mount at '/../x'"]


def test_paths_below_their_mount_and_ttys_with_a_terminal(tmp_path: Path) -> None:
    fown = {"uid": 0, "euid": 0, "signum": 0, "pid_type": 0, "pid": 0}

    def paths(d: dict[str, Any]) -> None:
        d["files"] += [
            {"type": "REG", "id": 2, "reg": {"id": 2, "flags": 0, "pos": 0, "fown": fown,
                                             "name": "/etc/shadow", "mnt_id": 78}},
            {"type": "REG", "id": 3, "reg": {"id": 3, "flags": 0, "pos": 0, "fown": fown,
                                             "name": "/../../etc/shadow", "mnt_id": 76}},
            {"type": "REG", "id": 4, "reg": {"id": 4, "flags": 0, "pos": 0, "fown": fown,
                                             "name": "/x", "mnt_id": 555}},
            {"type": "UNIXSK", "id": 5, "usk": {
                "id": 5, "ino": 1, "type": "DGRAM", "state": "CLOSE", "flags": 0, "uflags": 0,
                "backlog": 0, "peer": 0, "fown": fown, "opts": {
                    "so_sndbuf": 1, "so_rcvbuf": 1, "so_snd_tmo_sec": 0, "so_snd_tmo_usec": 0,
                    "so_rcv_tmo_sec": 0, "so_rcv_tmo_usec": 0},
                "name": "/run/host.sock=00", "mnt_id": 78}},
            {"type": "TTY", "id": 6, "tty": {"id": 6, "tty_info_id": 1, "flags": 0,
                                             "fown": fown}}]
        d["ttys"] = [{"id": 1, "type": "CONSOLE", "locked": False, "exclusive": False,
                      "packet_mode": False, "sid": 0, "pgrp": 0, "rdev": 0}]
    assert found(tmp_path, paths) == [
        "open file /etc/shadow, outside the mount it is on (/dev)",
        "open file '/../../etc/shadow'",
        "open file /x on mount 555, which the dump does not have",
        "unix socket bound at /run/host.sock, outside the mount it is on (/dev)",
        "a terminal (console, file 6)"]


def test_check_lists_every_finding_with_its_remedy(tmp_path: Path) -> None:
    d = copy.deepcopy(GENUINE)
    d["ids"][1]["uts_ns_id"] = HOST["uts"]
    d["cores"][1] = core("kvserver", no_new_privs=0)
    directory = write(tmp_path / "criu", d)
    from torpor import criu_images

    with pytest.raises(RestoreError) as refused:
        criu_images.check(str(directory), SPEC, Config())
    message = str(refused.value)
    assert message.startswith("the checkpoint's CRIU images would restore what its spec and "
                              "this node's restore policy do not grant:\n")
    assert "  - task 1 (kvserver) in the dumping host's uts namespace, where the spec gives the " \
           "container its own (allow with: [restore] host_namespaces = [\"uts\"])" in message
    assert "without no_new_privs" in message


def test_a_zombie_as_criu_dumps_it_is_read_and_needs_no_grant(tmp_path: Path) -> None:
    """CRIU writes a zombie's leader thread as 0 (or garbage) and gives it a core image only (no ids, no
    credentials): the dump loads and the zombie is no finding, even under a seccomp spec."""
    def with_zombie(d: dict[str, Any]) -> None:
        d["pstree"].append({"pid": 9, "ppid": 1, "pgid": 1, "sid": 1, "threads": [0]})
        d["cores"][9] = {"mtype": "X86_64", "tc": {"task_state": 2, "exit_code": 7,
                                                   "personality": 0, "flags": 0,
                                                   "blk_sigset": 0, "comm": "sh"}}

    assert found(tmp_path, with_zombie) == []
    loaded = dump.load(str(tmp_path / "criu"))
    assert [(t.pid, t.dead) for t in loaded.tasks] == [(1, False), (9, True)]
    seccomp_spec = copy.deepcopy(SPEC)
    seccomp_spec["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW"}
    assert found(tmp_path, with_zombie, seccomp_spec) == found(tmp_path, None, seccomp_spec)

    def threaded_zombie(d: dict[str, Any]) -> None:
        with_zombie(d)
        d["pstree"][-1]["threads"] = [0, 10]
        d["cores"][10] = d["cores"][9]

    with pytest.raises(FormatError, match="zombie 9 has 2 threads"):
        found(tmp_path, threaded_zombie)


def test_malformed_images_are_format_errors_in_words(tmp_path: Path) -> None:
    directory = write(tmp_path / "criu", GENUINE)
    inventory = directory / "inventory.img"
    core_img = directory / "core-1.img"
    data = core_img.read_bytes()
    core_img.write_bytes(data[:-3])
    with pytest.raises(FormatError, match=r"core-1\.img has a record of .* bytes past its end"):
        dump.load(str(directory))
    core_img.write_bytes(inventory.read_bytes())
    with pytest.raises(FormatError, match=r"core-1\.img is not a CORE image"):
        dump.load(str(directory))
    core_img.write_bytes(data[:8] + b"\x05\x00\x00\x00\xff\xff\xff\xff\xff")
    with pytest.raises(FormatError, match="cannot parse as core_entry"):
        dump.load(str(directory))
    core_img.unlink()
    os.symlink("/etc/passwd", core_img)
    with pytest.raises(FormatError, match=r"core-1\.img cannot be read"):
        dump.load(str(directory))
    from torpor import criu_images

    with pytest.raises(RestoreError, match="the checkpoint's CRIU images cannot be checked"):
        criu_images.check(str(directory), SPEC, Config())


def test_a_malformed_spec_is_an_error_in_words(tmp_path: Path) -> None:
    from torpor import criu_images

    directory = write(tmp_path / "criu", GENUINE)
    bad = json.loads(json.dumps(SPEC))
    bad["process"]["user"] = {"uid": "root"}
    with pytest.raises(RestoreError, match="the spec's process, mounts or namespaces are malformed"):
        criu_images.check(str(directory), bad, Config())


def test_missing_definitions_are_a_restore_error_with_the_remedy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "_loaded", None)
    monkeypatch.setitem(sys.modules, "pycriu", None)   # as if never installed
    monkeypatch.setitem(sys.modules, "pycriu.images", None)
    with pytest.raises(RestoreError) as refused:
        reader.definitions()
    assert "CRIU's image definitions (pycriu) are not installed" in str(refused.value)
    assert "packaging/install-deps.sh" in str(refused.value)


def test_rootfs_paths_resolve_inside_the_rootfs(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "kvserver").write_text("")
    (root / "tmp").mkdir()
    os.symlink("/bin", root / "usr-bin")             # absolute: the container's /bin
    os.symlink("../../../..", root / "tmp" / "up")   # `..` stops at the root
    os.symlink(str(tmp_path), root / "host")         # a host path: looked up inside
    (tmp_path / "secret").write_text("")
    assert rootfs.exists_inside(str(root), "/bin/kvserver")
    assert rootfs.exists_inside(str(root), "/usr-bin/kvserver")
    assert rootfs.exists_inside(str(root), "/tmp/up/bin/kvserver")
    assert not rootfs.exists_inside(str(root), "/host/secret")
    assert not rootfs.exists_inside(str(root), "/bin/kvserver/x")
    os.symlink("loop", root / "loop")
    assert not rootfs.exists_inside(str(root), "/loop")
    loaded = dump.Dump({}, (), (dump.Mount(76, "overlay", "/", "/", "overlay", ""),), (
        dump.PathUse("open file", "/bin/kvserver", 76, 1, False),
        dump.PathUse("open file", "/host/secret", 76, 2, False),
        dump.PathUse("unix socket bound at", "/tmp/s", 76, 3, True),
        dump.PathUse("unix socket bound at", "/nowhere/s", 76, 4, True)), ())
    assert [f.what for f in rootfs.findings(loaded, str(root))] == [
        "open file /host/secret, which is not in the container's root filesystem",
        "unix socket bound at /nowhere/s, which is not in the container's root filesystem "
        "(nor its directory)"]


def test_legacy_file_images_and_host_namespace_files_are_read_too(tmp_path: Path) -> None:
    images = pytest.importorskip("pycriu.images")
    d = copy.deepcopy(GENUINE)
    d["files"].append({"type": "NS", "id": 7, "nsf": {"id": 7, "ns_id": HOST["net"],
                                                      "ns_cflag": 0x40000000, "flags": 0}})
    directory = write(tmp_path / "criu", d)
    fown = {"uid": 0, "euid": 0, "signum": 0, "pid_type": 0, "pid": 0}
    with open(directory / "reg-files.img", "wb") as f:   # what CRIU before 3.x wrote
        images.dump({"magic": "REG_FILES", "entries": [
            {"id": 8, "flags": 0, "pos": 0, "fown": fown, "name": "/dev/../etc", "mnt_id": 78}]},
            f)
    what = [f.what for f in checks.findings(dump.load(str(directory)), SPEC)]
    assert what == ["open file '/dev/../etc'",
                    "an open file (file 7) of the dumping host's network namespace"]
    assert [f.what for f in checks.findings(dump.load(str(directory)), SPEC, ("network",))] == [
        "open file '/dev/../etc'"]
