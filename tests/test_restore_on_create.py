"""Restore on create: `ctr run` (and `nerdctl run`, and a pod's CreateContainer) of a checkpoint
image under the torpor runtime restores it where the node's `[restore] on_create` allows it, on
every containerd version (1.6, 2.1 and 2.4 with `--containerd`; pods on 2.1 and 2.4), with real
components. Node A runs a counter, checkpoints it and pushes it to a
real registry, signed and unsigned; node B pulls the image with ctr and runs it with ctr, as a
user would, under each policy: "signed" restores the signed image (the counter goes on from
where it was), "off" starts it cold (the counter starts again, torpor does nothing: no request
for the state, no work directory), "signed" refuses the unsigned image in words and leaves
nothing (no task, no runc state, no CRIU images), and the cold-start annotation starts it cold.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from torpor.image.store import Store

from .conftest import Nodes, run_torpor
from .support import cri, subnets
from .support.containerd import Node
from .support.nerdctl import Nerdctl
from .support.processes import wait_for
from .support.registry import Registry
from .support.workload import COUNTER, read_counter, remove, task_status, wait_counter_above
from .support.world import World

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]
COUNTED = 100   # the counter (20 a second) is past this when checkpointed; a new one is not


class OnCreateNodes:
    """Node A (checkpoints and pushes) and node B (pulls and runs with ctr), whose `[restore]`
    each test sets."""

    def __init__(self, nodes: Nodes, base: Path, containerd: str, runc: str) -> None:
        self.base = base
        made = []
        for name in ("a", "b"):
            node_name = f"oc-{name}-{containerd}-{runc}"
            self.write(base / f"{node_name}.toml", node_name)
            made.append(nodes.start(node_name, config=base / f"{node_name}.toml",
                                    containerd=containerd, runc=runc))
        self.a, self.b = made

    def state_dir(self, node: Node) -> Path:
        return self.base / f"{node.name}-state"

    def store(self, node: Node) -> Path:
        return self.base / f"{node.name}-store"

    def write(self, path: Path, name: str, restore: str = "", runtime: str = "") -> None:
        path.write_text(f'[runtime]\n{runtime}state_dir = "{self.base}/{name}-state"\n'
                        f'log_dir = "{self.base}/{name}-logs"\n'
                        f'[image]\nstore = "{self.base}/{name}-store"\n[restore]\n{restore}')

    def policy(self, on_create: str, signatures: str = "if-present",
               trusted: Path | None = None) -> None:
        """B's `[restore]`; the node's own config file (runc's path kept where it has one)."""
        keys = f'"{trusted}"' if trusted else ""
        runtime = f'path = "{self.b.runc}"\n' if self.b.runc is not None else ""
        self.write(self.b.torpor_config, self.b.name,
                   f'on_create = "{on_create}"\nsignatures = "{signatures}"\n'
                   f"trusted_keys = [{keys}]\n", runtime)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("oc-keys")
    for argv in (["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                  "-out", str(directory / "signer.pem")],
                 ["pkey", "-in", str(directory / "signer.pem"), "-pubout",
                  "-out", str(directory / "signer.pub")]):
        subprocess.run(["openssl", *argv], check=True, capture_output=True)
    return directory


@pytest.fixture(scope="module")
def registry(session_dir: Path, containerd_version: str, runc_version: str) -> Iterator[Registry]:
    started = Registry(session_dir, f"oc-registry-{containerd_version}-{runc_version}").start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def pair(nodes: Nodes, session_dir: Path, containerd_version: str,
         runc_version: str) -> OnCreateNodes:
    return OnCreateNodes(nodes, session_dir, containerd_version, runc_version)


@pytest.fixture(scope="module")
def images(pair: OnCreateNodes, registry: Registry, keys: Path,
           test_image: dict[str, object]) -> dict[str, Any]:
    """A counter checkpointed on A (left running) and pushed signed, and again unsigned."""
    a = pair.a
    refs = {"signed": f"{registry.host}/oc/counter:signed",
            "unsigned": f"{registry.host}/oc/counter:unsigned"}
    a.ctr("run", "-d", *SHIM, str(test_image["name"]), "oc-src", "sh", "-c", COUNTER)
    try:
        wait_counter_above(a, "oc-src", COUNTED, timeout=30)
        run_torpor(a, "checkpoint", "oc-src", "-t", refs["signed"], "--push", "--leave-running",
               "--sign", str(keys / "signer.pem"))
        run_torpor(a, "checkpoint", "oc-src", "-t", refs["unsigned"], "--push", "--leave-running")
    finally:
        remove(a, "oc-src")
    for ref in refs.values():
        pair.b.ctr("images", "pull", "--plain-http", ref)
    return {"refs": refs}


def run_counter(b: Node, ref: str, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return b.ctr("run", "-d", *SHIM, *extra, ref, name, "sh", "-c", COUNTER, check=False)


def counts_again(b: Node, name: str) -> bool:
    """A new shell counting from 1 (the file holds the checkpoint's count until its first
    write, 50 ms in)."""
    time.sleep(0.5)
    return 0 < read_counter(b, name) < COUNTED


def nothing_left(pair: OnCreateNodes, name: str) -> None:
    b = pair.b
    assert task_status(b, name) == "NONE"
    assert not Path(f"/run/containerd/runc/{b.namespace}/{name}").exists()
    assert not list((pair.state_dir(b) / "on-create").glob("*"))
    assert str(pair.state_dir(b)) not in Path("/proc/self/mountinfo").read_text()
    cgroups = Path("/sys/fs/cgroup")
    assert not [*cgroups.glob(f"*/{b.namespace}/{name}"), *cgroups.glob(f"{b.namespace}/{name}")]


def test_a_signed_checkpoint_restores_when_ctr_runs_it(
        pair: OnCreateNodes, registry: Registry, images: dict[str, Any], keys: Path) -> None:
    b = pair.b
    pair.policy("signed", trusted=keys / "signer.pub")
    try:
        created = run_counter(b, images["refs"]["signed"], "oc-restored")
        assert created.returncode == 0, created.stderr
        assert task_status(b, "oc-restored") == "RUNNING"
        # the counter goes on from the checkpoint's value: the processes came back
        time.sleep(0.5)   # a new counter would be at 10 by now, from 1
        first = read_counter(b, "oc-restored")
        assert first > COUNTED, first
        assert wait_counter_above(b, "oc-restored", first) > first
        assert not list((pair.state_dir(b) / "on-create").glob("*"))   # CRIU's images gone
        assert Store(str(pair.store(b))).has(images["refs"]["signed"])   # torpor fetched it
        # checkpointed again, as any restored container: its image is marked once
        again = f"{registry.host}/oc/counter:again"
        run_torpor(b, "checkpoint", "oc-restored", "-t", again, "--push", "--leave-running")
        config = json.loads(subprocess.run(
            ["skopeo", "inspect", "--config", "--tls-verify=false", f"docker://{again}"],
            capture_output=True, text=True, check=True).stdout)
        assert [e for e in config["config"]["Env"] if e.startswith("TORPOR_CHECKPOINT=")] == \
            ["TORPOR_CHECKPOINT=torpor.checkpoint.v1"]
        # it stops, and is deleted, as any container
        b.ctr("tasks", "kill", "-s", "SIGKILL", "oc-restored")
    finally:
        remove(b, "oc-restored")
    assert not Path(f"/run/containerd/runc/{b.namespace}/oc-restored").exists()


def test_off_starts_it_cold_and_torpor_does_nothing(
        pair: OnCreateNodes, registry: Registry, images: dict[str, Any]) -> None:
    b = pair.b
    pair.policy("off")
    mark = registry.log_mark()
    try:
        created = run_counter(b, images["refs"]["signed"], "oc-off")
        assert created.returncode == 0, created.stderr
        assert counts_again(b, "oc-off")
    finally:
        remove(b, "oc-off")
    assert registry.requests_since(mark) == []   # no index, no signature, no state
    assert not list((pair.state_dir(b) / "on-create").glob("*"))


def test_an_unsigned_checkpoint_is_refused_in_words_and_leaves_nothing(
        pair: OnCreateNodes, images: dict[str, Any], keys: Path) -> None:
    b = pair.b
    pair.policy("signed", trusted=keys / "signer.pub")
    try:
        refused = run_counter(b, images["refs"]["unsigned"], "oc-unsigned")
        assert refused.returncode != 0
        assert "is not signed, and this node's [restore] on_create is \"signed\"" in \
            refused.stderr, refused.stderr
        assert "io.torpor.restore.cold-start=true" in refused.stderr   # what to do
        assert "Traceback" not in refused.stderr
        nothing_left(pair, "oc-unsigned")
    finally:
        remove(b, "oc-unsigned")
    assert "oc-unsigned" not in b.ctr("containers", "ls", "-q").stdout.split()
    assert "oc-unsigned" not in b.ctr("snapshots", "ls").stdout


def test_a_checkpoint_is_restored_only_onto_its_own_root_filesystem(
        pair: OnCreateNodes, images: dict[str, Any], keys: Path) -> None:
    """The container was made from one image; by its start its name points at another (a pull
    in between): the signed checkpoint the name now names is not restored over the first
    image's files. Refused in words, nothing left."""
    b = pair.b
    refs = images["refs"]
    pair.policy("signed", trusted=keys / "signer.pub")
    try:
        b.ctr("containers", "create", *SHIM, refs["unsigned"], "oc-swap", "--", "sh", "-c",
              COUNTER)
        b.ctr("images", "tag", "--force", refs["signed"], refs["unsigned"])
        started = b.ctr("tasks", "start", "-d", "oc-swap", check=False)
        assert started.returncode != 0
        assert "root filesystem was made from another image" in started.stderr, started.stderr
        nothing_left(pair, "oc-swap")
    finally:
        remove(b, "oc-swap")
        b.ctr("images", "rm", refs["unsigned"], check=False)
        b.ctr("images", "pull", "--plain-http", refs["unsigned"])


def test_the_cold_start_annotation_starts_it_cold(
        pair: OnCreateNodes, images: dict[str, Any], keys: Path) -> None:
    b = pair.b
    pair.policy("signed", trusted=keys / "signer.pub")
    try:
        created = run_counter(b, images["refs"]["signed"], "oc-cold",
                              "--annotation", "io.torpor.restore.cold-start=true")
        assert created.returncode == 0, created.stderr
        assert counts_again(b, "oc-cold")
    finally:
        remove(b, "oc-cold")
    nothing_left(pair, "oc-cold")


# Kubernetes: kubelet's CreateContainer and StartContainer (crictl's), a pod of runtime class
# torpor whose image is a torpor checkpoint image, on containerd 2.x's CRI (2.4: where
# containerd itself no longer restores through CreateContainer)

@dataclass
class CriPair:
    a: cri.CriNode
    b: cri.CriNode
    registry: Registry
    refs: dict[str, str]
    work: Path


@pytest.fixture(scope="module")
def cri_pair(world: World, keys: Path, containerd_version: str,
             runc_version: str) -> Iterator[CriPair]:
    if containerd_version == "1.6":
        pytest.skip("the tests' CRI nodes are containerd 2.x (tests/support/cri.py); run with "
                    "--containerd 2 or --containerd 2.4")
    base = world.base / f"oc-cri-{containerd_version}-{runc_version}"
    base.mkdir()
    registry = Registry(base, "registry").start()
    started: list[cri.CriNode] = []
    held: list[subnets.Subnet] = []   # the nodes' pod bridges are the host's
    try:
        refs = cri.publish_images(base, registry, world.image_layout)
        for name in ("oca", "ocb"):
            held.append(subnets.reserve())
            config = base / f"{name}.toml"
            policy = (f'on_create = "signed"\ntrusted_keys = ["{keys / "signer.pub"}"]\n'
                      if name == "ocb" else "")
            config.write_text(f'[runtime]\nstate_dir = "{base}/{name}-state"\n'
                              f'log_dir = "{base}/{name}-logs"\n[image]\n'
                              f'store = "{base}/{name}-store"\n[restore]\n{policy}')
            cri.start_node(base, name, world.bin, config, refs, held[-1].octet,
                           containerd_version, runc_version, started)
        work = base / "work"
        work.mkdir()
        yield CriPair(started[0], started[1], registry, refs, work)
    finally:
        for node in reversed(started):
            node.stop()
        for subnet in held:
            subnet.release()
        registry.stop()


def test_a_pod_of_runtime_class_torpor_restores_a_checkpoint_image(
        cri_pair: CriPair, keys: Path) -> None:
    a, b = cri.Crictl(cri_pair.a), cri.Crictl(cri_pair.b)
    pod = a.run_pod(cri_pair.work, "oc-src", "torpor")
    container = a.create(pod, cri_pair.work, "oc-src", cri_pair.refs["workload"],
                         ["sh", "-c", COUNTER])
    a("start", container)
    ref = f"{cri_pair.registry.host}/oc/pod-counter:1"
    try:
        a.wait_counter_above(container, COUNTED, timeout=30)
        run_torpor(cri_pair.a, "--namespace", "k8s.io", "checkpoint", container, "-t", ref,
                   "--push", "--leave-running", "--insecure", "--sign", str(keys / "signer.pem"))
    finally:
        a("stopp", pod, check=False)
        a("rmp", "-f", pod, check=False)
    # what kubelet does for a pod whose image is the checkpoint image: pull, create, start
    b("pull", ref)
    pod = b.run_pod(cri_pair.work, "oc-restored", "torpor")
    try:
        restored = b.create(pod, cri_pair.work, "oc-restored", ref, ["sh", "-c", COUNTER])
        b("start", restored)
        assert b.state(restored) == "CONTAINER_RUNNING"
        time.sleep(0.5)   # a new counter would be at 10 by now, from 1
        first = b.read_counter(restored)
        assert first > COUNTED, f"the counter started again: {first}"
        assert b.wait_counter_above(restored, first) > first
        assert Store(str(cri_pair.work.parent / "ocb-store")).has(ref)   # torpor fetched it
    finally:
        b("stopp", pod, check=False)
        b("rmp", "-f", pod, check=False)
    # a pod that asks to start cold (the runtime class passes io.torpor.* pod annotations on)
    config = cri.pod_config("oc-cold", cri_pair.work / "oc-cold-logs")
    config["annotations"] = {"io.torpor.restore.cold-start": "true"}
    (cri_pair.work / "oc-cold-pod.json").write_text(json.dumps(config))
    pod = b("runp", "--runtime", "torpor", str(cri_pair.work / "oc-cold-pod.json"))
    try:
        cold = b.create(pod, cri_pair.work, "oc-cold", ref, ["sh", "-c", COUNTER])
        b("start", cold)
        time.sleep(0.5)
        assert 0 < b.read_counter(cold) < COUNTED
    finally:
        b("stopp", pod, check=False)
        b("rmp", "-f", pod, check=False)


def test_a_restore_that_fails_says_why_in_runcs_words_and_leaves_nothing(
        pair: OnCreateNodes, images: dict[str, Any], keys: Path) -> None:
    """A spec runc cannot apply (a CFS period of 100 µs, below the kernel's 1 ms): runc restore
    fails, its words reach the user after torpor's, and nothing of the restore stays."""
    b = pair.b
    pair.policy("signed", trusted=keys / "signer.pub")
    try:
        failed = run_counter(b, images["refs"]["signed"], "oc-failed", "--cpu-period", "100",
                             "--cpu-quota", "100")
        assert failed.returncode != 0
        said = failed.stderr
        assert "OCI runtime create failed: torpor: runc restore failed (exit 1): " in said, said
        assert 'failed to write "100"' in said, said   # runc's own words
        assert "Traceback" not in said
        nothing_left(pair, "oc-failed")
    finally:
        remove(b, "oc-failed")


def test_nerdctl_run_restores_a_checkpoint_of_a_nerdctl_container(
        pair: OnCreateNodes, registry: Registry, keys: Path, world: World) -> None:
    """nerdctl on A runs the counter, torpor checkpoints it; `nerdctl run` of the image on B
    restores it (its spec is nerdctl's, with the same seccomp profile and masked paths)."""
    a, b = pair.a, pair.b
    pair.policy("signed", trusted=keys / "signer.pub")
    on_a, on_b = Nerdctl(a, "on-create", world.image_tar), Nerdctl(b, "on-create", world.image_tar)
    ref = f"{registry.host}/oc/nerdctl-counter:1"
    run = ["run", "-d", "--runtime", "io.containerd.torpor.v2", "--network", "none"]
    try:
        source = on_a(*run, "--name", "oc-nsrc", str(world.image["name"]), "sh", "-c",
                      COUNTER).stdout.strip()
        wait_for(lambda: int(on_a("exec", "oc-nsrc", "cat", "/tmp/count", check=False).stdout
                             or 0) > COUNTED, timeout=30, what="the counter under nerdctl")
        run_torpor(a, "--namespace", on_a.namespace, "checkpoint", source, "-t", ref, "--push",
                   "--leave-running", "--sign", str(keys / "signer.pem"))
        on_b("pull", "--insecure-registry", ref)
        on_b(*run, "--name", "oc-nerdctl", ref, "sh", "-c", COUNTER)
        time.sleep(0.5)   # a new counter would be at 10 by now, from 1
        first = int(on_b("exec", "oc-nerdctl", "cat", "/tmp/count").stdout)
        assert first > COUNTED, first
    finally:
        on_a.close()
        on_b.close()
