"""CRIU's images checked before runc sees them (torpor.criu_images): one genuine checkpoint of a
busybox container (kvserver, and syslogd with a unix socket bound at /dev/log), its images
edited with CRIU's own crit (decode, edit the JSON, encode), each restored with `torpor
restore` on a node whose policy is the default. Each edit is refused with its findings in words,
nothing is left behind (no container, task, snapshot, scratch or work directory) and a canary
tree on the host is unchanged; the genuine checkpoint still restores and serves.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from torpor.criu_images import dump as criu_dump

from .conftest import Nodes
from .support.containerd import Node
from .support.hostile import make_canary, tree_digest
from .support.nerdctl import Nerdctl
from .support.processes import wait_for
from .support.workload import kv_ask, remove, wait_kv

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]
ALL_CAPS = [0xFFFFFFFF, 0x1FF]


@dataclass
class World:
    node: Node
    base: Path
    canary: Path
    directory: Path    # the genuine checkpoint directory
    image: str         # the test image's name


def torpor(node: Node, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(node.bin_dir / "torpor"), *args], capture_output=True,
                            text=True, env=node.env, timeout=300)
    if check:
        assert result.returncode == 0, f"torpor {' '.join(args)}: {result.stdout}{result.stderr}"
    return result


@pytest.fixture(scope="module")
def corpus(nodes: Nodes, session_dir: Path, test_image: dict[str, object]) -> Iterator[World]:
    base = session_dir / "criu-images"
    base.mkdir()
    config = base / "node.toml"   # the default policy: nothing granted
    config.write_text(f'[runtime]\nstate_dir = "{base}/state"\n'
                      f'log_dir = "{base}/state-logs"\n[image]\nstore = "{base}/store"\n')
    node = nodes.start("criu-images", config=config, containerd="2")
    canary = make_canary(base / "canary")
    node.ctr("run", "-d", *SHIM, str(test_image["name"]), "ck-images", "sh", "-c",
             "syslogd -n -O /tmp/messages & exec kvserver 7001")
    try:
        wait_kv(node, "ck-images", port=7001)
        assert kv_ask(node, "ck-images", "SET k kept", port=7001) == "OK"
        torpor(node, "checkpoint", "ck-images", "-o", str(base / "dir"))
    finally:
        remove(node, "ck-images")
    yield World(node, base, canary, base / "dir", str(test_image["name"]))


# Editing with crit ---------------------------------------------------------------------------

def crit(*args: str) -> None:
    subprocess.run([str(Path(shutil.which("crit") or _venv_crit())), *args], check=True,
                   capture_output=True, timeout=60)


def _venv_crit() -> str:
    import sys

    return str(Path(sys.executable).parent / "crit")


def edit_image(directory: Path, name: str, change: Callable[[dict[str, Any], World], None],
               w: World) -> None:
    """crit decode, change the JSON, crit encode; checkpoint.json lists the new size."""
    image = directory / "criu" / name
    as_json = image.with_suffix(".json")
    crit("decode", "-i", str(image), "-o", str(as_json))
    document = json.loads(as_json.read_text())
    change(document, w)
    as_json.write_text(json.dumps(document))
    crit("encode", "-i", str(as_json), "-o", str(image))
    as_json.unlink()
    relist(directory, f"criu/{name}", image.stat().st_size)


def relist(directory: Path, rel: str, size: int) -> None:
    metadata = json.loads((directory / "checkpoint.json").read_text())
    metadata["files"] = [{**f, "size": size} if f["path"] == rel else f
                         for f in metadata["files"]]
    (directory / "checkpoint.json").write_text(json.dumps(metadata))


def edit_spec(directory: Path, change: Callable[[dict[str, Any]], None]) -> None:
    metadata = json.loads((directory / "checkpoint.json").read_text())
    change(metadata["container"]["spec"])
    (directory / "checkpoint.json").write_text(json.dumps(metadata))


def all_caps(directory: Path, w: World) -> None:
    def change(core: dict[str, Any], _: World) -> None:
        creds = core["entries"][0]["thread_core"]["creds"]
        for key in ("cap_inh", "cap_prm", "cap_eff", "cap_bnd", "cap_amb"):
            creds[key] = list(ALL_CAPS)
    edit_image(directory, "core-1.img", change, w)


def user_1000(directory: Path, w: World) -> None:
    """The spec's user is 1000, without capabilities; the image's processes say uid 0."""
    def change(spec: dict[str, Any]) -> None:
        spec["process"]["user"] = {"uid": 1000, "gid": 1000}
        for kind in ("effective", "permitted", "ambient", "inheritable"):
            spec["process"]["capabilities"][kind] = []
    edit_spec(directory, change)

    def uid_0(core: dict[str, Any], _: World) -> None:
        creds = core["entries"][0]["thread_core"]["creds"]
        for key in ("uid", "euid", "suid", "fsuid"):
            creds[key] = 0
    edit_image(directory, "core-1.img", uid_0, w)


def file_to_host(directory: Path, w: World) -> None:
    def change(files: dict[str, Any], w: World) -> None:
        for entry in files["entries"]:
            if entry.get("reg", {}).get("name") == "/tmp/messages":
                entry["reg"]["name"] = str(w.canary / "secret")
    edit_image(directory, "files.img", change, w)


def socket_to_host(directory: Path, w: World) -> None:
    def change(files: dict[str, Any], w: World) -> None:
        for entry in files["entries"]:
            if entry.get("usk", {}).get("name") == "/dev/log=00":
                entry["usk"]["name"] = f"{w.canary / 'victim' / 'sock'}=00"
    edit_image(directory, "files.img", change, w)


def host_mount_namespace(directory: Path, w: World) -> None:
    crit("decode", "-i", str(directory / "criu/inventory.img"), "-o", str(directory / "inv.json"))
    host = json.loads((directory / "inv.json").read_text())["entries"][0]["root_ids"]["mnt_ns_id"]
    (directory / "inv.json").unlink()

    def change(ids: dict[str, Any], _: World) -> None:
        ids["entries"][0]["mnt_ns_id"] = host
    edit_image(directory, "ids-1.img", change, w)


def host_bind_mount(directory: Path, w: World) -> None:
    def change(mounts: dict[str, Any], w: World) -> None:
        run = next(m for m in mounts["entries"] if m["mountpoint"] == "/run")
        mounts["entries"].append({**run, "mnt_id": 999, "mountpoint": "/host",
                                  "ext_key": str(w.canary), "fstype": 0})
    name = next(p.name for p in (directory / "criu").glob("mountpoints-*.img"))
    edit_image(directory, name, change, w)


def spec_seccomp(directory: Path, w: World) -> None:
    edit_spec(directory, lambda spec: spec["linux"].__setitem__(
        "seccomp", {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}))


CASES: dict[str, tuple[Callable[[Path, World], None], list[str]]] = {
    "all-capabilities": (all_caps, ["task 1 (kvserver) with inheritable, permitted, effective, "
                                    "bounding and ambient capabilities beyond the spec's bounding "
                                    "set", "CAP_SYS_ADMIN"]),
    "uid-0-for-user-1000": (user_1000, ["as uids 0/0/0/0 (real, effective, saved, fs): the "
                                        "spec's user is 1000", "the spec's user 1000 cannot have"]),
    "open-file-on-the-host": (file_to_host, ["which is not in the container's root filesystem",
                                             "canary/secret"]),
    "unix-socket-on-the-host": (socket_to_host, ["unix socket bound at", "victim/sock, outside "
                                                 "the mount it is on (/dev)"]),
    "host-mount-namespace": (host_mount_namespace, ["task 1 (kvserver) in the dumping host's "
                                                    "mount namespace"]),
    "host-bind-mount": (host_bind_mount, ["a mount runc is to bring from outside", "at /host"]),
    "seccomp-dropped": (spec_seccomp, ["without the spec's seccomp filter (seccomp disabled)"]),
}

# torpor-runc finds these, with the container's root filesystem mounted: inspect cannot
AT_RESTORE_ONLY = {"open-file-on-the-host"}


def nothing_left(w: World, name: str) -> None:
    assert name not in w.node.ctr("containers", "ls", "-q").stdout.split()
    assert name not in w.node.ctr("tasks", "ls").stdout
    assert name not in w.node.ctr("snapshots", "ls").stdout
    assert not list((w.base / "store").glob("scratch/*"))
    assert not list((w.base / "state").glob(f"restore-work/*{name}*"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_edited_images_are_refused_in_words(corpus: World, tmp_path: Path, case: str) -> None:
    tamper, words = CASES[case]
    copy = tmp_path / "ck"
    shutil.copytree(corpus.directory, copy, symlinks=True)
    tamper(copy, corpus)
    before = tree_digest(corpus.canary)
    name = f"ci-{case}"[:40]
    try:
        result = torpor(corpus.node, "restore", str(copy), "--name", name, check=False)
        assert result.returncode != 0, f"restored: {result.stdout}{result.stderr}"
        assert "Traceback" not in result.stderr
        assert "CRIU images would restore what its spec and this node's restore policy do not "\
               "grant" in result.stderr, result.stderr
        for expected in words:
            assert expected in result.stderr, result.stderr
        nothing_left(corpus, name)
        print(f"\n{case}: {result.stderr.strip()[-400:]}")
        if case not in AT_RESTORE_ONLY:   # inspect shows the same findings
            inspect = torpor(corpus.node, "inspect", str(copy))
            assert "a restore here would refuse" in inspect.stdout
    finally:
        remove(corpus.node, name)
    assert tree_digest(corpus.canary) == before, "the canary tree changed"
    assert not (corpus.canary / "victim" / "sock").exists()


def test_the_genuine_checkpoint_restores(corpus: World) -> None:
    name = "ci-genuine"
    try:
        started = time.monotonic()
        result = torpor(corpus.node, "restore", str(corpus.directory), "--name", name, "--json")
        print(f"\ngenuine restore: {time.monotonic() - started:.2f} s, "
              f"{json.loads(result.stdout).get('timings')}")
        wait_kv(corpus.node, name, port=7001)
        assert kv_ask(corpus.node, name, "GET k", port=7001) == "kept"
        inspect = torpor(corpus.node, "inspect", str(corpus.directory))
        assert "CRIU images  nothing beyond the spec" in inspect.stdout
    finally:
        remove(corpus.node, name)


def test_a_container_holding_a_zombie_restores(corpus: World) -> None:
    """A child that exited unreaped is a zombie in CRIU's dump (its leader thread written as
    uninitialised memory, a core image only); the check reads it and the restore brings the
    server back. Before, a zombie in a dump (a shell's child caught as it exited) failed the
    restore: "core-0.img cannot be read"."""
    node, name = corpus.node, "ci-zombie"
    directory = corpus.base / "zombie"
    try:
        node.ctr("run", "-d", *SHIM, str(corpus.image), name, "sh", "-c",
                 "(exit 7) & exec kvserver 7002")
        wait_kv(node, name, port=7002)
        assert kv_ask(node, name, "SET k undead", port=7002) == "OK"
        torpor(node, "checkpoint", name, "-o", str(directory))
        tasks = criu_dump.load(str(directory / "criu")).tasks
        assert [t.dead for t in tasks] == [False, True], tasks   # CRIU did dump a zombie
        remove(node, name)
        torpor(node, "restore", str(directory), "--name", name)
        wait_kv(node, name, port=7002)
        assert kv_ask(node, name, "GET k", port=7002) == "undead"
        assert "CRIU images  nothing beyond the spec" in torpor(node, "inspect",
                                                                str(directory)).stdout
    finally:
        remove(node, name)


def test_nerdctl_restores_are_checked_by_torpor_runc(node: Node, torpor_bin: Path,
                                                    test_image: dict[str, object]) -> None:
    """nerdctl's own checkpoint, sealed by this node, edited with crit in nerdctl's checkpoint
    directory (the executable's path made a host file's): `nerdctl start --checkpoint` is
    refused by torpor-runc in words before runc restore; put back as it was, it restores."""
    nerd = Nerdctl(node, "criu-images", Path(str(test_image["tar"])))
    try:
        nerd("run", "-d", "--name", "web", "--runtime", str(torpor_bin / "torpor-runc"),
             "--network", "none", str(test_image["name"]), "sh", "-c", "exec kvserver 7000")
        wait_for(lambda: nerd.exec_out("web", "sh", "-c", "echo PING | nc -w5 127.0.0.1 7000")
                 == "PONG\n", what="kvserver")
        nerd("checkpoint", "create", "web", "ck1")
        saved = nerd.data_root / "checkpoints" / "ck1"
        genuine = saved.parent / "ck1.genuine"
        shutil.copytree(saved, genuine)
        files, as_json = saved / "files.img", saved / "files.json"
        host_file = str(torpor_bin / "torpor-runc")   # on the host, not in the container
        crit("decode", "-i", str(files), "-o", str(as_json))
        document = json.loads(as_json.read_text())
        for entry in document["entries"]:
            if entry.get("reg", {}).get("name") == "/bin/kvserver":
                entry["reg"]["name"] = host_file
        as_json.write_text(json.dumps(document))
        crit("encode", "-i", str(as_json), "-o", str(files))
        as_json.unlink()
        refused = nerd("start", "--checkpoint", "ck1", "web", check=False)
        assert refused.returncode != 0
        assert "CRIU images would restore what its spec and this node's restore policy do not "\
               "grant" in refused.stderr, refused.stderr
        assert f"open file {host_file}, which is not in the container's root filesystem" \
            in refused.stderr
        assert nerd.status("web") != "running"
        shutil.rmtree(saved)
        genuine.rename(saved)
        nerd("start", "--checkpoint", "ck1", "web")
        assert nerd.exec_out("web", "sh", "-c", "echo PING | nc -w5 127.0.0.1 7000") == "PONG\n"
    finally:
        nerd.close()


def test_what_the_check_costs(corpus: World, test_image: dict[str, object]) -> None:
    """The check on the busybox checkpoint and on one of 64 MiB of memory (its images are read,
    never its pages): well under a second each, in a fresh process as torpor-runc runs it."""
    node, name = corpus.node, "ci-memhog"
    node.ctr("run", "-d", *SHIM, str(test_image["name"]), name, "sh", "-c",
             "memhog 64 /tmp/gap & exec kvserver 7002")
    try:
        wait_kv(node, name, port=7002)
        time.sleep(1)   # memhog has filled its memory
        torpor(node, "checkpoint", name, "-o", str(corpus.base / "memhog"))
    finally:
        remove(node, name)
    import sys

    for directory in (corpus.directory, corpus.base / "memhog"):
        pages = sum(p.stat().st_size for p in (directory / "criu").glob("pages-*.img"))
        script = ("import json, time; t0 = time.monotonic(); from torpor import criu_images; "
                  "from torpor.config import Config; from torpor.criu_images import reader; "
                  "reader.definitions(); t1 = time.monotonic(); "
                  f"spec = json.load(open('{directory}/checkpoint.json'))['container']['spec']; "
                  f"found = criu_images.findings('{directory}/criu', spec, Config()); "
                  "t2 = time.monotonic(); print(len(found), t1 - t0, t2 - t1)")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             check=True).stdout.split()
        assert out[0] == "0"
        print(f"\n{directory.name}: pages {pages >> 20} MiB, import with pycriu "
              f"{float(out[1]) * 1000:.0f} ms, check {float(out[2]) * 1000:.0f} ms")
        assert float(out[1]) + float(out[2]) < 2
