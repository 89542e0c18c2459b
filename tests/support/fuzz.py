"""A seeded mutation fuzzer over genuine checkpoints, in their three source forms: a checkpoint
directory, an OCI layout and an image in a registry. Used by tests/test_fuzz_checkpoints.py (a
few hundred cases in make test) and bench/fuzz.py (as many as asked).

A case is named `FORM:SEED:N`; the name alone seeds its random generator, so it reproduces on
any machine from the same genuine checkpoint. Each case stacks one to three small mutations on a
fresh copy: the metadata (checkpoint.json and the spec inside it), torpor-runc's state
(torpor-state.json), tar layers (names, types, link targets, modes, PAX headers, size fields,
truncation), the chunk index and packs, the OCI documents (index.json, the image index,
manifests, configs, descriptors and their digests) and CRIU's image bytes (bit flips,
truncation, size fields). Where a mutation changes a file, the listed size or the digests above
it are usually made to match, so that the change reaches the code behind those checks.

The oracle is the hostile corpus' (tests/test_hostile_checkpoints.py): `torpor restore` on a
node with the default policy either refuses in words ("torpor: error:", no traceback, nothing
left: no container, task, snapshot, scratch space or restore work) or restores; either way the
canary tree outside every target is unchanged (tree_digest), nothing named *escaped* or pwned
appears, and no restore takes longer than the per-case timeout.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

from .containerd import Node
from .hostile import UP, archive_escapes, make_canary, tree_digest
from .registry import Registry
from .workload import remove, wait_kv

SHIM = ["--runtime", "io.containerd.torpor.v2"]
FORMS = ("dir", "layout", "registry")
CASE_TIMEOUT = 60.0
OUTCOMES = ("refused", "restored", "escape", "hang", "internal", "leftover", "unpushable",
            "harness")   # harness: the fuzzer itself failed to make the case


# The genuine checkpoint -----------------------------------------------------------------------

@dataclass
class Genuine:
    node: Node
    base: Path           # holds the node's state and store, the canary, the volume
    canary: Path
    directory: Path
    layout: Path
    registry: Registry | None = None
    work: Path = field(default_factory=Path)

    @property
    def store(self) -> Path:
        return self.base / "store"

    @property
    def state(self) -> Path:
        return self.base / "state"


def node_config(base: Path) -> Path:
    """The default policy: nothing granted; the node's own state dir and image store."""
    base.mkdir(parents=True, exist_ok=True)
    config = base / "node.toml"
    config.write_text(f'[runtime]\nstate_dir = "{base}/state"\n'
                      f'log_dir = "{base}/state-logs"\n[image]\nstore = "{base}/store"\n')
    return config


def make_genuine(node: Node, base: Path, image: str, registry: Registry | None) -> Genuine:
    """A container with a volume, a read-write layer and a listening server, checkpointed as a
    directory and as an OCI layout (torpor checkpoint), then removed."""
    canary = make_canary(base / "canary")
    volume = base / "volume"
    volume.mkdir()
    node.ctr("run", "-d", *SHIM, "--mount", f"type=bind,src={volume},dst=/data,options=rbind:rw",
             image, "genuine", "sh", "-c",
             "echo v > /data/v; mkdir /data/sub; echo note > /root/note; exec kvserver 7000")
    try:
        wait_kv(node, "genuine")
        for extra in (["-o", str(base / "dir"), "--leave-running"], ["-o", str(base / "layout"),
                                                                     "--oci"]):
            result = torpor(node, "checkpoint", "genuine", *extra)
            assert result.returncode == 0, result.stderr
    finally:
        remove(node, "genuine")
    work = base / "cases"
    work.mkdir()
    return Genuine(node, base, canary, base / "dir", base / "layout", registry, work)


def torpor(node: Node, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(node.bin_dir / "torpor"), *args], capture_output=True, text=True,
                          env=node.env, timeout=timeout)


# Hostile values ---------------------------------------------------------------------------------

def strings(canary: Path) -> list[str]:
    c = str(canary)
    return ["", " ", "..", "../" * 8, f"{UP}{c.lstrip('/')}/escaped", c, f"{c}/escaped",
            "/", "/etc/passwd", "/proc/1/ns/net", "a\x00b", "\n10.0.0.1 x", "x" * 5000,
            "\u202e\ufeff名前\U0001f600", "\ufffd", "-1", "%s%n%x",
            f"$(touch {c}/pwned)", "sha256:" + "0" * 64, "sha256:../../x", "C:\\x", "~root",
            "genuine", "io.torpor.x", "0x10", "1e309", "true", "null"]


NUMBERS: list[Any] = [0, -1, 1, 2**31, 2**32 + 7, 2**63, 2**64 + 1, -(2**63) - 1, 10**100, 1.5,
                      -0.0, 4096, 7]


def random_value(rng: random.Random, canary: Path, depth: int = 0) -> Any:
    kind = rng.randrange(7 if depth < 2 else 4)
    if kind == 0:
        return rng.choice(strings(canary))
    if kind == 1:
        return rng.choice(NUMBERS)
    if kind == 2:
        return rng.choice([None, True, False])
    if kind == 3:
        return rng.choice([[], {}, ""])
    if kind == 4:
        return [random_value(rng, canary, depth + 1) for _ in range(rng.randrange(1, 4))]
    return {rng.choice(strings(canary))[:40]: random_value(rng, canary, depth + 1)}


def _slots(doc: Any, out: list[tuple[Any, Any]]) -> None:
    if isinstance(doc, dict):
        for key, value in doc.items():
            out.append((doc, key))
            _slots(value, out)
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out.append((doc, i))
            _slots(value, out)


def mutate_json(doc: Any, rng: random.Random, canary: Path) -> str:
    """One small change anywhere in a JSON document; returns what it did, in words."""
    slots: list[tuple[Any, Any]] = []
    _slots(doc, slots)
    if not slots:
        return "nothing to change"
    parent, key = rng.choice(slots)
    old = parent[key]
    op = rng.randrange(8)
    if op == 0 and isinstance(parent, dict):
        del parent[key]
        return f"deleted {key!r}"
    if op == 1 and isinstance(parent, list):
        parent.insert(key, json.loads(json.dumps(old)))
        return f"duplicated list entry {key}"
    if op == 2:
        parent[key] = rng.choice(NUMBERS)
    elif op == 3:
        parent[key] = rng.choice(strings(canary))
    elif op == 4 and isinstance(old, str):
        parent[key] = old + rng.choice(["/../../..", "\x00", "\u00e9", "/", "\n"])
    elif op == 5 and isinstance(parent, dict):
        parent[rng.choice(strings(canary))[:60]] = random_value(rng, canary)
        return "added a field"
    elif op == 6 and isinstance(old, int) and not isinstance(old, bool):
        parent[key] = rng.choice([-old - 1, old * 4096 + 1, 2**64 - 1, -1, str(old)])
    else:
        parent[key] = random_value(rng, canary)
    return f"{key!r}: {type(old).__name__} -> {json.dumps(parent[key])[:60]}"


CAPS = ["CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_SYS_MODULE", "CAP_DAC_READ_SEARCH", "ALL",
        "CAP_NOT_A_CAP", "cap_net_admin", ""]
ANNOTATIONS = ["org.criu.config", "org.systemd.property.ExecStopPost", "run.oci.hooks.stdout",
               "io.containerd.runc.v2.group", "io.torpor.restore.add-addresses",
               "io.torpor.restore.netns", "io.kubernetes.cri.sandbox-id", "org.opencontainers.x",
               "harmless.example/key", "bad\x00key", ""]
HOOK_STAGES = ["prestart", "createRuntime", "createContainer", "startContainer", "poststart",
               "poststop", "unknownStage"]


def mutate_spec(spec: Any, rng: random.Random, canary: Path) -> str:
    """One change of what a spec asks a node for (or, at times, anything in it)."""
    if not isinstance(spec, dict):
        return mutate_json(spec, rng, canary)
    c = str(canary)
    linux: dict[str, Any] = spec.setdefault("linux", {}) \
        if isinstance(spec.get("linux", {}), dict) else {}
    process: dict[str, Any] = spec["process"] if isinstance(spec.get("process"), dict) else {}
    what = rng.choice(["hook", "mount", "mount-edit", "annotation", "namespace", "device",
                       "capability", "hostname", "cgroupsPath", "user", "misc", "json"])
    if what == "hook":
        stage = rng.choice(HOOK_STAGES)
        path = rng.choice(["/bin/sh", "torpor-hook", "sh", f"{c}/secret", "/usr/bin/env"])
        name = rng.choice(["torpor-hook", "sh", ""])
        spec.setdefault("hooks", {})[stage] = [{"path": path, "args": [
            name, "-c", f"touch {c}/pwned"], "timeout": rng.choice([1, -1, 0, 2**40])}]
        return f"hook {stage} {path}"
    if what == "mount":
        mount: dict[str, Any] = rng.choice([
            {"destination": "/host", "type": "bind", "source": c, "options": ["rbind", "rw"]},
            {"destination": "/host", "type": "none", "source": c, "options": ["bind"]},
            {"destination": f"/{UP}escaped", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/p", "type": "proc", "source": "proc"},
            {"destination": "/o", "type": "overlay", "source": "overlay",
             "options": [f"lowerdir={c}", f"upperdir={c}/victim", "workdir=/tmp"]},
            {"destination": "relative", "type": "bind", "source": "../../../",
             "options": ["rbind"]}])
        if isinstance(spec.get("mounts"), list):
            spec["mounts"].append(mount)
        else:
            spec["mounts"] = [mount]
        return f"mount {mount['type']} {mount['source']} at {mount['destination']}"
    if what == "mount-edit" and isinstance(spec.get("mounts"), list) and spec["mounts"]:
        mount = rng.choice(spec["mounts"])
        if isinstance(mount, dict):
            key = rng.choice(["source", "destination", "type", "options"])
            mount[key] = rng.choice([c, f"{c}/victim", "/", "/dev/sda", "../..", ["rbind", "rw"],
                                     ["rbind", "rw", "suid", "dev"], "bind", 5, None])
            return f"mount {mount.get('destination')!r} {key} changed"
    if what == "annotation":
        key = rng.choice(ANNOTATIONS)
        value = rng.choice([f"{c}/evil.conf", "true", "/bin/sh", "10.0.0.1/8", "", "x" * 10000])
        if not isinstance(spec.get("annotations"), dict):
            spec["annotations"] = {}
        spec["annotations"][key] = value
        return f"annotation {key!r}"
    if what == "namespace" and isinstance(linux.get("namespaces"), list):
        spaces = linux["namespaces"]
        op = rng.randrange(4)
        if op == 0 and spaces:
            gone = spaces.pop(rng.randrange(len(spaces)))
            return f"namespace {gone} removed"
        if op == 1 and spaces:
            ns = rng.choice(spaces)
            if isinstance(ns, dict):
                ns["path"] = rng.choice([f"/proc/1/ns/{ns.get('type', 'net')}", c, "/proc/self"])
                return f"namespace {ns.get('type')} joins {ns['path']}"
        if op == 2 and spaces:
            spaces.append(json.loads(json.dumps(rng.choice(spaces))))
            return "namespace duplicated"
        spaces.append({"type": rng.choice(["time", "cgroup", "user", "bogus", ""])})
        return "namespace added"
    if what == "device":
        device = {"path": rng.choice(["/dev/hostdisk", f"/dev/{UP}escaped", "/dev/null"]),
                  "type": rng.choice(["b", "c", "p", "u", "x"]),
                  "major": rng.choice([8, 1, -1, 2**40]), "minor": rng.choice([0, 3, -1])}
        if rng.random() < 0.5:
            linux["devices"] = [device]
            return f"device {device}"
        resources = linux.setdefault("resources", {})
        if isinstance(resources, dict):
            resources["devices"] = [{"allow": True, "access": "rwm",
                                     "type": rng.choice(["a", "b", "c"])}]
        return "device cgroup opened"
    if what == "capability" and isinstance(process.get("capabilities"), dict):
        caps = process["capabilities"]
        which = rng.choice(["bounding", "effective", "permitted", "inheritable", "ambient"])
        existing = caps.get(which)
        caps[which] = [*(existing if isinstance(existing, list) else []), rng.choice(CAPS)]
        return f"capability {caps[which][-1]!r} in {which}"
    if what == "hostname":
        spec["hostname"] = rng.choice([*strings(canary), "h\n10.0.0.1 registry", "a" * 300])
        return f"hostname {spec['hostname'][:30]!r}"
    if what == "cgroupsPath":
        linux["cgroupsPath"] = rng.choice(["/../../system.slice", "../../..", c, "system.slice:x:y",
                                           "/sys/fs/cgroup", "a\x00b", "/"])
        return f"cgroupsPath {linux['cgroupsPath']!r}"
    if what == "user" and isinstance(process.get("user"), dict):
        process["user"][rng.choice(["uid", "gid", "additionalGids", "umask"])] = rng.choice(
            [0, -1, 2**32, 65534, [0, 0], "root"])
        return "process.user changed"
    if what == "misc":
        edits: list[tuple[dict[str, Any], str, Any]] = [
            (process, "noNewPrivileges", False), (process, "cwd", f"{UP}etc"),
            (process, "apparmorProfile", "unconfined"), (process, "oomScoreAdj", -1000),
            (process, "rlimits", [{"type": "RLIMIT_NOFILE", "hard": 2**64, "soft": -1}]),
            (linux, "sysctl", {"kernel.core_pattern": "|/bin/sh"}), (linux, "maskedPaths", []),
            (linux, "readonlyPaths", []), (linux, "seccomp", None),
            (linux, "rootfsPropagation", "shared"), (linux, "personality", {"domain": "x"}),
            (spec.setdefault("root", {}) if isinstance(spec.get("root", {}), dict) else {},
             "path", rng.choice([c, "../../..", "/"]))]
        target, key, value = rng.choice(edits)
        target[key] = value
        return f"{key} = {json.dumps(value)[:40]}"
    return "spec: " + mutate_json(spec, rng, canary)


# Tar archives and bytes -------------------------------------------------------------------------

def _read_tar(data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]] | None:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            out = []
            for info in tar.getmembers():
                body = tar.extractfile(info).read() if info.isreg() else None  # type: ignore[union-attr]
                out.append((info, body))
            return out
    except (tarfile.TarError, OSError, ValueError, EOFError):
        return None


def _write_tar(entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, body in entries:
            if info.isreg():
                body = body or b""
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
            else:
                info.size = 0
                tar.addfile(info)
    return out.getvalue()


def mutate_tar(data: bytes, rng: random.Random, canary: Path) -> tuple[bytes, str]:
    entries = _read_tar(data)
    op = rng.randrange(10)
    if entries is None or op >= 8:
        return mutate_bytes(data, rng, header=True)
    c = str(canary)
    if op == 0 or not entries:
        case = rng.choice(sorted(archive_escapes(canary)))
        extra = [(info, body) for info, body in archive_escapes(canary)[case][1]]
        at = rng.randrange(len(entries) + 1)
        entries[at:at] = extra
        what = f"tar: added {case}"
    else:
        i = rng.randrange(len(entries))
        info, body = entries[i]
        if op == 1:
            info.name = rng.choice([f"{UP}{c.lstrip('/')}/escaped", f"{c}/escaped", "",
                                    "a/" * 200 + "x", info.name + "/../../../escaped", ".",
                                    "./" + info.name, "\u00e9\u202e" + info.name])
            what = f"tar: entry {i} renamed {info.name[:40]!r}"
        elif op == 2:
            info.type = rng.choice([tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE,
                                    tarfile.BLKTYPE, tarfile.FIFOTYPE, tarfile.DIRTYPE,
                                    tarfile.CONTTYPE, b"x", tarfile.GNUTYPE_SPARSE])
            info.linkname = rng.choice([c, f"{c}/secret", f"{UP}{c.lstrip('/')}", info.name])
            info.devmajor, info.devminor = 8, 0
            what = f"tar: entry {i} type {info.type!r} -> {info.linkname[:40]!r}"
        elif op == 3:
            entries.insert(i, (info, body))
            what = f"tar: entry {i} duplicated"
        elif op == 4:
            key = rng.choice(["path", "linkpath", "size", "uid", "mtime",
                              "SCHILY.xattr.security.capability", "GNU.sparse.map",
                              "SCHILY.xattr.trusted.overlay.opaque"])
            value = rng.choice([f"{UP}{c.lstrip('/')}/escaped", "99999999999999", "-1", "nan",
                                "\x01\x00\x00\x02\xff\xff\xff\xff", "y", c])
            info.pax_headers = {**info.pax_headers, key: value}
            what = f"tar: entry {i} PAX {key}={value[:30]!r}"
        elif op == 5:
            info.mode = rng.choice([0o7777, 0o4755, 0o2777, 0o1000])
            info.uid, info.gid = rng.choice([(0, 0), (2**21 - 1, 7), (65534, 65534)])
            what = f"tar: entry {i} mode {info.mode:o}"
        elif op == 6:
            del entries[i]
            what = f"tar: entry {i} removed"
        else:
            if body is not None:
                body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) + body
            entries[i] = (info, body)
            what = f"tar: entry {i} content changed"
    try:
        return _write_tar(entries), what
    except (ValueError, tarfile.TarError, UnicodeError, OverflowError) as e:
        return mutate_bytes(data, rng, header=True)[0], f"{what} (unwritable: {e}; bytes instead)"


def mutate_bytes(data: bytes, rng: random.Random, header: bool = False) -> tuple[bytes, str]:
    """Bit flips, truncation, a size field (CRIU: the u32 after the magic; tar: a header's size),
    bytes set or appended."""
    buf = bytearray(data)
    op = rng.randrange(6)
    if not buf or op == 0:
        cut = rng.randrange(len(buf) + 1) if buf else 0
        return bytes(buf[:cut]), f"truncated to {cut} of {len(buf)} bytes"
    if op == 1:
        for _ in range(rng.randrange(1, 9)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        return bytes(buf), "bits flipped"
    if op == 2 and header and len(buf) >= 512:
        block = 512 * rng.randrange(max(1, min(len(buf) // 512, 8)))
        size = rng.choice([b"77777777777\x00", b"00000000000\x00", b"\x80" + b"\xff" * 11,
                           b"-1\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"])
        buf[block + 124:block + 136] = size
        return bytes(buf), f"tar header at {block}: size field {size!r}"
    if op == 2 or op == 3:
        offset = rng.choice([4, 8, 12]) if len(buf) > 16 else 0
        value = rng.choice([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, len(buf) * 2, 0x10000000])
        buf[offset:offset + 4] = value.to_bytes(4, "little")
        return bytes(buf), f"u32 at {offset} = {value:#x}"
    if op == 4:
        at = rng.randrange(len(buf))
        buf[at:at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff"])
        return bytes(buf), f"bytes set at {at}"
    return bytes(buf) + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))), \
        "garbage appended"


# A checkpoint directory -------------------------------------------------------------------------

def _write(path: Path, data: bytes) -> None:
    """Replace the file (never write through a hard link to the genuine one)."""
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_bytes(data)


def mutate_directory(directory: Path, rng: random.Random, canary: Path, count: int) -> list[str]:
    done: list[str] = []
    document = json.loads((directory / "checkpoint.json").read_text())
    files = [p for p in sorted(directory.rglob("*")) if p.is_file() and p.name != "checkpoint.json"]
    changed: dict[str, int] = {}
    meta_changes: list[Callable[[], str]] = []
    for _ in range(count):
        target = rng.choices(["meta", "spec", "state", "tar", "criu", "file"],
                             [20, 30, 10, 15, 20, 5])[0]
        if target == "meta":
            meta_changes.append(lambda: "checkpoint.json " + mutate_json(document, rng, canary))
        elif target == "spec":
            def spec_change() -> str:
                container = document.get("container")
                if isinstance(container, dict) and "spec" in container:
                    return "spec " + mutate_spec(container["spec"], rng, canary)
                return "checkpoint.json " + mutate_json(document, rng, canary)
            meta_changes.append(spec_change)
        elif target == "state":
            path = directory / "criu" / "torpor-state.json"
            state = json.loads(path.read_text())
            what = mutate_json(state, rng, canary)
            data = json.dumps(state).encode()
            _write(path, data)
            changed["criu/torpor-state.json"] = len(data)
            done.append("torpor-state.json " + what)
        elif target in ("tar", "criu"):
            pool = [p for p in files if (p.suffix == ".tar") == (target == "tar")]
            path = rng.choice(pool)
            data = path.read_bytes()
            new, what = (mutate_tar(data, rng, canary) if target == "tar"
                         else mutate_bytes(data, rng))
            _write(path, new)
            changed[str(path.relative_to(directory))] = len(new)
            done.append(f"{path.relative_to(directory)} {what}")
        else:
            path = rng.choice(files)
            op = rng.randrange(3)
            path.unlink()
            if op == 0:
                done.append(f"{path.relative_to(directory)} deleted")
            elif op == 1:
                path.symlink_to(rng.choice([canary / "secret", Path("/dev/zero"), Path("..")]))
                done.append(f"{path.relative_to(directory)} made a symlink")
            else:
                path.mkdir()
                done.append(f"{path.relative_to(directory)} made a directory")
    if changed and rng.random() < 0.85 and isinstance(document.get("files"), list):
        for entry in document["files"]:
            if isinstance(entry, dict) and entry.get("path") in changed:
                entry["size"] = changed[entry["path"]]
    done.extend(change() for change in meta_changes)
    if meta_changes or changed:
        _write(directory / "checkpoint.json", json.dumps(document).encode())
    return done


# An OCI layout ----------------------------------------------------------------------------------

def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Layout:
    """An OCI layout loaded as documents and blobs; `save` writes what changed and rewrites the
    digests above it, except where a mutation asked for a stale one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.oci_index: Any = json.loads((root / "index.json").read_text())
        self.blobs = root / "blobs" / "sha256"
        self.top: Any = self.oci_index["manifests"][0]
        self.index: Any = self.load(self.top)
        self.manifests: list[Any] = [self.load(d) for d in self.index["manifests"]]
        self.new: dict[int, tuple[Any, bytes, bool]] = {}   # id(descriptor) -> (it, data, rehash)
        self.stale: set[int] = set()                         # documents written at their old digest

    def path(self, digest: str) -> Path:
        return self.blobs / digest.split(":", 1)[1]

    def load(self, descriptor: Any) -> Any:
        return json.loads(self.path(descriptor["digest"]).read_bytes())

    def descriptors(self) -> list[tuple[Any, Any]]:
        """(manifest, descriptor) of every config and layer."""
        out = []
        for m in self.manifests:
            if isinstance(m, dict):
                layers = m.get("layers")
                out += [(m, d) for d in [m.get("config"), *(layers if isinstance(layers, list)
                                                              else [])] if isinstance(d, dict)]
        return out

    def data(self, descriptor: Any) -> bytes:
        if id(descriptor) in self.new:
            return self.new[id(descriptor)][1]
        try:
            return self.path(str(descriptor["digest"])).read_bytes()
        except (KeyError, IndexError, OSError):
            return b""   # an earlier mutation broke its digest

    def put(self, descriptor: Any, data: bytes, rehash: bool) -> None:
        self.new[id(descriptor)] = (descriptor, data, rehash)

    def _store(self, descriptor: Any, data: bytes, rehash: bool) -> None:
        if rehash:
            descriptor["digest"], descriptor["size"] = _digest(data), len(data)
        try:
            _write(self.path(str(descriptor["digest"])), data)
        except (KeyError, TypeError, ValueError, IndexError, OSError):
            pass   # a descriptor whose digest a mutation broke: nowhere to write

    def save(self) -> None:
        for descriptor, data, rehash in self.new.values():
            self._store(descriptor, data, rehash)
        entries = self.index.get("manifests") if isinstance(self.index, dict) else None
        for entry, manifest in zip(entries if isinstance(entries, list) else [], self.manifests,
                                   strict=False):
            if isinstance(entry, dict):
                self._store(entry, json.dumps(manifest).encode(), id(manifest) not in self.stale)
        if isinstance(self.top, dict):
            self._store(self.top, json.dumps(self.index).encode(),
                        id(self.index) not in self.stale)
        _write(self.root / "index.json", json.dumps(self.oci_index).encode())


def _zstd_json(data: bytes) -> Any:
    return json.loads(zstandard.ZstdDecompressor().decompress(data, max_output_size=64 << 20))


def _metadata(layout: Layout) -> tuple[Any, Any] | None:
    for manifest in layout.manifests:
        if isinstance(manifest, dict) and manifest.get("artifactType") == \
                "application/vnd.torpor.checkpoint.v1":
            return manifest, manifest["config"]
    return None


def mutate_layout(root: Path, rng: random.Random, canary: Path, count: int,
                  always_rehash: bool = False) -> list[str]:
    layout = Layout(root)
    done: list[str] = []
    found = _metadata(layout)
    metadata = layout.load(found[1]) if found else None
    criu_sizes: dict[str, int] = {}
    renames: dict[str, str] = {}
    for _ in range(count):
        rehash = always_rehash or rng.random() < 0.9
        target = rng.choices(["metadata", "spec", "document", "descriptor", "chunk-index",
                              "pack", "state-layer", "layer", "raw"],
                             [15, 20, 10, 10, 10, 8, 15, 7, 5])[0]
        descs = layout.descriptors()
        by_type = {t: [(m, d) for m, d in descs if t in str(d.get("mediaType", ""))]
                   for t in ("chunk-index", "pack.v1", "state.v1", "tar")}
        if target in ("metadata", "spec") and metadata is not None:
            if target == "spec" and isinstance(metadata.get("container"), dict) \
                    and "spec" in metadata["container"]:
                done.append("spec " + mutate_spec(metadata["container"]["spec"], rng, canary))
            else:
                done.append("metadata " + mutate_json(metadata, rng, canary))
            continue
        if target == "document":
            docs: list[tuple[str, Any]] = [("index", layout.index), ("oci-index",
                                                                      layout.oci_index)]
            docs += [(f"manifest {i}", m) for i, m in enumerate(layout.manifests)]
            name, doc = rng.choice(docs)
            done.append(f"{name} " + mutate_json(doc, rng, canary))
            if not rehash:
                layout.stale.add(id(doc))
            continue
        if target == "descriptor" and descs:
            _, d = rng.choice(descs)
            key = rng.choice(["digest", "size", "mediaType", "annotations", "urls"])
            d[key] = rng.choice({
                "digest": ["sha256:" + "ab" * 32, "sha256:../../../etc/passwd", "md5:00",
                           rng.choice(descs)[1].get("digest", "")],
                "size": [-1, 0, 2**63, 10**30, "12", 1.5],
                "mediaType": ["application/vnd.example.mystery", "",
                              "application/vnd.oci.image.layer.v1.tar",
                              "application/vnd.torpor.checkpoint.pack.v1"],
                "annotations": [{"io.torpor.checkpoint.role": "state"}, {"x": 5}, []],
                "urls": [["http://127.0.0.1:1/x"], ["file:///etc/passwd"]]}[key])
            done.append(f"descriptor {key} = {json.dumps(d[key])[:50]}")
            continue
        if target == "chunk-index" and by_type["chunk-index"]:
            _, d = rng.choice(by_type["chunk-index"])
            try:
                doc = _zstd_json(layout.data(d))
                what = mutate_json(doc, rng, canary)
                data = zstandard.ZstdCompressor().compress(json.dumps(doc).encode())
            except (zstandard.ZstdError, ValueError):
                data, what = mutate_bytes(layout.data(d), rng)
            layout.put(d, data, rehash)
            done.append("chunk index " + what)
            continue
        if target == "pack" and by_type["pack.v1"]:
            _, d = rng.choice(by_type["pack.v1"])
            data, what = mutate_bytes(layout.data(d), rng)
            layout.put(d, data, rehash)
            if rehash and isinstance(d.get("digest"), str):   # the chunk index follows
                renames[d["digest"]] = _digest(data)
            done.append("pack " + what)
            continue
        if target in ("state-layer", "layer"):
            pool = by_type["state.v1"] if target == "state-layer" else by_type["tar"]
            pool = [(m, d) for m, d in pool if d.get("size", 0) < 1 << 20]  # not the base layer
            if pool:
                _, d = rng.choice(pool)
                raw = layout.data(d)
                try:
                    plain = zstandard.ZstdDecompressor().decompress(raw, max_output_size=64 << 20)
                except zstandard.ZstdError:
                    plain = b""
                entries = _read_tar(plain) if plain else None
                imgs = [i for i, (info, _) in enumerate(entries or []) if info.name.endswith(".img")]
                if entries and imgs and rng.random() < 0.5:
                    i = rng.choice(imgs)
                    info, body = entries[i]
                    new, what = mutate_bytes(body or b"", rng)
                    entries[i] = (info, new)
                    criu_sizes[info.name] = len(new)
                    plain, what = _write_tar(entries), f"{info.name} {what}"
                elif plain:
                    plain, what = mutate_tar(plain, rng, canary)
                else:
                    plain, what = mutate_bytes(raw, rng)
                if rng.random() < 0.15:   # at times, not compressed at all
                    data, what = plain, what + " (stored uncompressed)"
                else:
                    data = zstandard.ZstdCompressor().compress(plain)
                layout.put(d, data, rehash)
                done.append(f"layer {str(d.get('mediaType')).rsplit('.', 2)[-2]} {what}")
                continue
        if descs:   # raw: any small blob's bytes, its digest left as it was or made to match
            _, d = rng.choice([(m, d) for m, d in descs if d.get("size", 0) < 1 << 20] or descs)
            data, what = mutate_bytes(layout.data(d), rng)
            layout.put(d, data, rehash)
            done.append(f"blob {str(d.get('mediaType'))[-30:]} {what}")
    for _, d in layout.descriptors():
        if renames and "chunk-index" in str(d.get("mediaType", "")):
            try:
                text = zstandard.ZstdDecompressor().decompress(
                    layout.data(d), max_output_size=64 << 20).decode()
            except (zstandard.ZstdError, UnicodeError):
                continue
            for a, b in renames.items():
                text = text.replace(a, b)
            layout.put(d, zstandard.ZstdCompressor().compress(text.encode()), True)
    if metadata is not None and found is not None:
        if criu_sizes and rng.random() < 0.85 and isinstance(metadata.get("files"), list):
            for entry in metadata["files"]:
                if isinstance(entry, dict) and entry.get("path") in criu_sizes:
                    entry["size"] = criu_sizes[entry["path"]]
        if id(found[1]) not in layout.new:
            layout.put(found[1], json.dumps(metadata).encode(), True)
    layout.save()
    return done


# A registry -------------------------------------------------------------------------------------

class Unpushable(Exception):
    """The registry itself refused the mutated image (it checks digests and references)."""


def _http(method: str, url: str, data: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)
    except (ValueError, OSError) as e:   # a header or URL the mutation made unsendable
        raise Unpushable(f"{method} {url[:80]}: {e}") from None


def push_layout(layout: Path, host: str, repo: str, tag: str) -> str:
    """Every blob, then the manifests below the top index, then the index as `tag`, by the
    registry API itself (no client that could check or fix what it sends)."""
    base = f"http://{host}/v2/{repo}"
    blobs = layout / "blobs" / "sha256"
    for blob in sorted(blobs.iterdir()):
        data = blob.read_bytes()
        digest = _digest(data)
        if _http("HEAD", f"{base}/blobs/{digest}")[0] == 200:
            continue
        status, headers = _http("POST", f"{base}/blobs/uploads/")
        location = headers.get("Location", "")
        if status != 202 or not location:
            raise Unpushable(f"upload refused: {status}")
        url = location if location.startswith("http") else f"http://{host}{location}"
        status, _ = _http("PUT", f"{url}{'&' if '?' in url else '?'}digest={digest}", data,
                          {"Content-Type": "application/octet-stream"})
        if status != 201:
            raise Unpushable(f"blob {digest} refused: {status}")

    def put(descriptor: Any, reference: str) -> None:
        if not isinstance(descriptor, dict):
            raise Unpushable("descriptor is not an object")
        path = blobs / str(descriptor.get("digest", ":")).split(":", 1)[-1]
        if not path.is_file():
            raise Unpushable("manifest blob missing")
        data = path.read_bytes()
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("manifests"), list):
            for child in doc["manifests"]:
                put(child, str(child.get("digest")) if isinstance(child, dict) else "")
        media = str(descriptor.get("mediaType") or "application/vnd.oci.image.manifest.v1+json")
        status, _ = _http("PUT", f"{base}/manifests/{reference}", data, {"Content-Type": media})
        if status != 201:
            raise Unpushable(f"manifest {reference} refused: {status}")

    top = json.loads((layout / "index.json").read_text())["manifests"][0]
    put(top, tag)
    return f"{host}/{repo}:{tag}"


# Running a case ---------------------------------------------------------------------------------

@dataclass
class Result:
    case: str
    outcome: str
    mutations: list[str]
    detail: str
    seconds: float


def copy_genuine(source: Path, dest: Path) -> None:
    """A copy whose large blobs are hard links (the mutations replace files, never edit them)."""
    def link_or_copy(src: str, dst: str) -> None:
        if os.path.getsize(src) > 1 << 20:
            os.link(src, dst)
        else:
            shutil.copy2(src, dst)
    shutil.copytree(source, dest, symlinks=True, copy_function=link_or_copy)


def leftovers(g: Genuine, name: str) -> list[str]:
    found = []
    if name in g.node.ctr("containers", "ls", "-q").stdout.split():
        found.append("container")
    if name in g.node.ctr("tasks", "ls").stdout:
        found.append("task")
    if name in g.node.ctr("snapshots", "ls").stdout:
        found.append("snapshot")
    found += [str(p) for p in g.store.glob("scratch/*")]
    found += [str(p) for p in g.state.glob(f"restore-work/*{name}*")]
    found += [str(p) for p in g.state.glob(f"containers/*/{name}/restore-grant.json")]
    return found


def escaped(g: Genuine, before: str) -> str:
    if tree_digest(g.canary) != before:
        return "the canary tree changed"
    if (g.canary / "pwned").exists():
        return "a hook or script ran (pwned)"
    hits = [p for p in g.base.rglob("*escaped*") if g.work not in p.parents]
    hits += [p for p in Path("/tmp").glob("*escaped*")]
    return f"written outside: {hits}" if hits else ""


def run_case(g: Genuine, case: str, timeout: float = CASE_TIMEOUT, keep: bool = False,
             mutate: bool = True) -> Result:
    form, _, number = case.split(":")
    rng = random.Random(case)
    start = time.monotonic()
    where = g.work / case.replace(":", "-")
    if where.exists():
        shutil.rmtree(where)
    where.mkdir()
    volume = where / "volume"
    volume.mkdir()
    count = rng.choice([1, 1, 2, 2, 3]) if mutate else 0
    name = f"fz-{form[0]}{number}"
    extra = ["--volume", f"/data={volume}"]
    try:
        return _run_case(g, case, form, number, rng, where, volume, count, name, extra,
                         timeout, start)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OSError) as e:
        return Result(case, "harness", [], f"{type(e).__name__}: {e}", time.monotonic() - start)
    finally:
        if not keep:
            shutil.rmtree(where, ignore_errors=True)


def _run_case(g: Genuine, case: str, form: str, number: str, rng: random.Random, where: Path,
              volume: Path, count: int, name: str, extra: list[str], timeout: float,
              start: float) -> Result:
    if form == "dir":
        source = where / "ck"
        copy_genuine(g.directory, source)
        mutations = mutate_directory(source, rng, g.canary, count)
        target = str(source)
    else:
        source = where / "layout"
        copy_genuine(g.layout, source)
        mutations = mutate_layout(source, rng, g.canary, count, always_rehash=form == "registry")
        target = str(source)
        if form == "registry":
            assert g.registry is not None
            try:
                target = push_layout(source, g.registry.host, f"fuzz/c{number}", "1")
            except Unpushable as e:
                return Result(case, "unpushable", mutations, str(e),
                              time.monotonic() - start)
            extra.append("--insecure")
    before = tree_digest(g.canary)
    try:
        result = torpor(g.node, "restore", target, "--name", name, *extra, timeout=timeout)
    except subprocess.TimeoutExpired:
        remove(g.node, name)
        return Result(case, "hang", mutations, f"no answer in {timeout:.0f} s",
                      time.monotonic() - start)
    err = result.stderr
    last = (err.strip().splitlines() or [""])[-1][:200]
    if "Traceback" in err or "internal error" in err or \
            (result.returncode != 0 and "torpor: error:" not in err):
        outcome, detail = "internal", err[-1500:]
    elif result.returncode != 0:
        left = leftovers(g, name)
        outcome, detail = ("leftover", f"{left}: {last}") if left else ("refused", last)
    else:
        outside = [p for p in volume.rglob("*")
                   if not p.is_symlink() and volume.resolve() not in p.resolve().parents]
        outcome, detail = ("escape", f"volume entries outside: {outside}") if outside \
            else ("restored", "")
    remove(g.node, name)
    if result.returncode == 0 and leftovers(g, name)[:1] == ["container"]:
        outcome, detail = "leftover", "the restored container could not be removed"
    broke = escaped(g, before)
    if broke:
        outcome, detail = "escape", broke
    return Result(case, outcome, mutations, detail, time.monotonic() - start)


@dataclass
class Summary:
    results: list[Result] = field(default_factory=list)

    def add(self, result: Result) -> None:
        self.results.append(result)

    def failures(self) -> list[Result]:
        return [r for r in self.results if r.outcome not in ("refused", "restored", "unpushable")]

    def counts(self) -> dict[str, int]:
        return {o: sum(r.outcome == o for r in self.results) for o in OUTCOMES}

    def text(self) -> str:
        counts = self.counts()
        lines = [f"cases {len(self.results)}: " + ", ".join(f"{k} {v}" for k, v in counts.items())]
        for r in self.failures():
            lines.append(f"  {r.outcome}: {r.case} [{'; '.join(r.mutations)}] {r.detail[-600:]}")
        return "\n".join(lines)


def cases(form: str, seed: int, n: int) -> list[str]:
    return [f"{form}:{seed}:{i}" for i in range(n)]
