"""`torpor kube migrate NS/POD --to NODE`: a running pod moved to another node, through the
API server with the user's kubeconfig. In order:
 1. the pod (movable: torpor.kube.moved_pod), the target node (Ready) and torpor's node agent
    on the source node (the node installer's pod), found;
 2. each container checkpointed through kubelet's checkpoint API (the API server's node
    proxy), one after the other; the pod keeps running. A pod of several containers is frozen
    once for all of them (`torpor kube freeze` on its node, through the agent, ops/pod_freeze):
    their states are of one instant, and the pod is thawed once they are all taken, or, at the
    latest, before its liveness probes would fail it (the migration then fails);
 3. each archive turned into its checkpoint image on the source node by the node agent
    (`torpor kube image`: signed with the node's key, encrypted where the node's configuration
    says so), pushed to `repository`; the archive, which holds the workload's memory, removed
    from the node whatever happened: it never leaves the node;
 4. a new pod on the target node from the original's spec, each container's image its
    checkpoint image; waited for until every container runs and is ready;
 5. the original deleted, unless `keep_source`.
A failure or an interrupt at any step leaves the source pod running as it was and removes what
was made: the archives on the node, the new pod, and the images pushed (deleted from the
registry by digest through the source's agent, with its credentials; a registry that refuses
deletes keeps them, and the error names them).

Between the checkpoint and the original's deletion the original runs on: what it changes then
is not in the moved pod (docs/kubernetes.md).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from torpor.errors import KubeError
from torpor.kube.api import KubeApi, is_ready, pod_path
from torpor.kube.moved_pod import (
    containers_to_move,
    failure_of,
    is_running,
    liveness_budget,
    moved_pod,
)
from torpor.reporting import SILENT, Progress

IN_FLIGHT_TRIES = 3
LIVENESS_MARGIN_S = 2         # the freeze ends this long before the pod's probes would fail it
TORPOR_HANDLER = "torpor"     # the runtime handler `torpor runtime-config` installs


@dataclass(frozen=True)
class MigrateResult:
    source: str                       # NAMESPACE/POD
    source_node: str
    target_node: str
    pod: str                          # the new pod's name
    images: dict[str, str] = field(default_factory=dict)      # container -> checkpoint image
    checkpoint_seconds: float = 0.0   # kubelet's checkpoints, every container
    seconds: float = 0.0              # the whole migration, to the new pod ready
    source_deleted: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def migrate(api: KubeApi, namespace: str, name: str, target: str, *, repository: str,
            keep_source: bool = False, new_name: str | None = None, timeout_s: int = 300,
            progress: Progress = SILENT) -> MigrateResult:
    started = time.monotonic()
    original = api.pod(namespace, name)
    containers = containers_to_move(original, target)
    source = original["spec"]["nodeName"]
    if not is_ready(api.node(target)):
        raise KubeError(f"node {target} is not Ready")
    _check_runtime_class(api, original)
    agent = api.agent_on(source)
    target_agent = api.agent_on(target)
    verb = _restore_path(api, agent, target_agent, original, target, progress)
    progress.step(f"moving {namespace}/{name} ({', '.join(containers)}) from {source} to "
                  f"{target} (node agent {agent})")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    with contextlib.ExitStack() as undo:
        archives: dict[str, str] = {}
        with _one_instant(api, agent, original, timeout_s, progress):
            for container in containers:
                progress.step(f"checkpointing {container} through kubelet on {source}")
                archive = _checkpoint(api, source, namespace, name, container, timeout_s,
                                      progress)
                archives[container] = archive
                undo.callback(_forget, api, agent, archive)
        checkpointed = time.monotonic()
        images: dict[str, str] = {}
        for container, archive in archives.items():
            ref = f"{repository.rstrip('/')}/{namespace}/{name}/{container}:{stamp}"
            progress.step(f"building and pushing {ref} on {source}")
            images[container] = _image_on_node(api, agent, verb, archive, ref, timeout_s)
            undo.callback(_unpush, api, agent, images[container])
        moved = new_name or f"{name[:57]}-{secrets.token_hex(2)}"
        manifest = moved_pod(original, images, target, moved)
        progress.step(f"creating the pod on {target}")
        undo.callback(_delete_new_pod, api, namespace, moved)   # before: an answer may be lost
        api.post(pod_path(namespace), manifest, f"creating the moved pod in {namespace}")
        progress.step(f"waiting for {namespace}/{moved} to run on {target}")
        uid = _wait_running(api, namespace, moved, timeout_s, images)
        if verb == "import":
            _check_restored(api, target_agent, target, namespace, moved, uid, images)
        undo.pop_all()     # the moved pod runs its restored state: nothing of it is undone now
    if not keep_source:
        progress.step(f"deleting {namespace}/{name} on {source}")
        _delete_source(api, namespace, name, original["metadata"].get("uid"), moved)
    return MigrateResult(f"{namespace}/{name}", source, target, moved, images,
                         checkpoint_seconds=checkpointed - started,
                         seconds=time.monotonic() - started, source_deleted=not keep_source)


@contextlib.contextmanager
def _one_instant(api: KubeApi, agent: str, pod: dict[str, Any], seconds: int,
                 progress: Progress) -> Iterator[None]:
    """A pod of several containers frozen once, for all of their checkpoints (kubelet takes
    one container per call): their states are of one instant."""
    if len(pod["spec"]["containers"]) < 2:
        yield
        return
    budget = liveness_budget(pod)
    if budget is not None:        # kubelet restarts a container frozen past its probes
        if budget <= LIVENESS_MARGIN_S + 1:
            raise KubeError(
                f"pod {pod['metadata']['name']}'s liveness probes allow {budget}s without an "
                "answer: too short to hold its containers frozen for their checkpoints (raise "
                "periodSeconds or failureThreshold)")
        seconds = min(seconds, budget - LIVENESS_MARGIN_S)
    started = time.monotonic()
    with api.pod_frozen(agent, pod["metadata"]["uid"], seconds) as frozen:
        progress.step(f"froze {frozen} at one instant")
        yield
    progress.step(f"thawed the pod after {time.monotonic() - started:.2f}s")


def _checkpoint(api: KubeApi, node: str, namespace: str, name: str, container: str,
                timeout_s: int, progress: Progress) -> str:
    """kubelet's checkpoint, tried again when CRIU found a connection the kernel accepted
    for the workload while it was frozen (in flight, not yet accept()ed): another instant
    may have none."""
    for attempt in range(1, IN_FLIGHT_TRIES + 1):
        try:
            return api.checkpoint(node, namespace, name, container, timeout_s)
        except KubeError as e:
            if "In-flight connection" not in str(e):
                raise
            if attempt == IN_FLIGHT_TRIES:
                raise KubeError(
                    f"{e}\n{IN_FLIGHT_TRIES} checkpoints of {container} each found a client "
                    "connection in flight (accepted by the kernel while the workload was "
                    "frozen): under the torpor runtime class, set [checkpoint] skip_in_flight "
                    "= true on the node; under another, add `skip-in-flight` to "
                    "/etc/criu/runc.conf (runc hands it to CRIU; the source, which runs on, "
                    "still answers those clients)") from None
            progress.step(f"a client connected to {container} during the checkpoint (in "
                          f"flight): checkpointing again ({attempt + 1}/{IN_FLIGHT_TRIES})")
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


def _restore_path(api: KubeApi, agent: str, target_agent: str, pod: dict[str, Any],
                  target: str, progress: Progress) -> str:
    """How `target` restores the pod (its node agent says: ops/kube_node): the node agent's
    verb that makes the image it restores from, `image` (containerd's CRI) or `import`
    (torpor's restore on create); refused in words where it cannot restore, would refuse what
    the source pushes, or would start the pod cold (restore on create is torpor-runc's: only a
    pod whose runtime class runs it is restored)."""
    source = pod["spec"]["nodeName"]
    facts = _agent_json(api, target_agent, ["node"], f"asking {target} how it restores")
    how, version = facts.get("restore"), facts.get("containerd")
    if how == "cri":
        progress.step(f"{target} (containerd {version}) restores through containerd's CRI")
        return "image"
    if how != "on-create":
        raise KubeError(
            f"node {target} (containerd {version}) cannot restore a pod from a checkpoint: its "
            "containerd does not restore through CreateContainer, and its torpor's [restore] "
            'on_create is "off": set it to "signed" there (docs/kubernetes.md)')
    if facts.get("on_create") == "signed" and not _agent_json(
            api, agent, ["node"], f"asking {source} what it signs").get("signs"):
        raise KubeError(
            f'node {target} restores only signed checkpoints ([restore] on_create = "signed") '
            f"and node {source} signs nothing it pushes: set [image] signing_key on {source} "
            f"and trust its public key on {target} ([restore] trusted_keys)")
    progress.step(f"{target} (containerd {version}) restores through torpor's restore on "
                  f"create ({facts.get('on_create')})")
    return "import"


def _check_runtime_class(api: KubeApi, pod: dict[str, Any]) -> None:
    """Only a pod under torpor's runtime class moves whole: torpor-runc saves its emptyDir
    volumes and /dev/shm with the checkpoint (kubelet's archive of a plain runc container
    holds neither: they would come back empty), and only torpor-runc restores on create (a
    plain runc would start it cold there)."""
    runtime_class = pod["spec"].get("runtimeClassName")
    handler = api.runtime_class_handler(runtime_class) if runtime_class else None
    if handler != TORPOR_HANDLER:
        under = (f"runtime class {runtime_class!r} (handler {handler!r})" if runtime_class
                 else "no runtime class (plain runc)")
        raise KubeError(
            f"pod {pod['metadata'].get('namespace', 'default')}/{pod['metadata']['name']} runs "
            f"under {under}: torpor kube migrate moves pods of a runtime class whose handler is "
            f"{TORPOR_HANDLER!r} (packaging/kubernetes/runtimeclass.yaml), whose volumes and "
            "/dev/shm are saved with them and which a target of any containerd restores")


def _check_restored(api: KubeApi, agent: str, target: str, namespace: str, name: str,
                    uid: str, images: dict[str, str]) -> None:
    """Each container of the moved pod was restored by torpor-runc on `target`, not started
    cold (its node agent reads torpor-runc's records): only then may the source go."""
    found = _agent_json(api, agent, ["restored", uid], f"asking {target} what it restored")
    cold = sorted(set(images) - set(found.get("restored") or []))
    if cold:
        raise KubeError(f"the moved pod {namespace}/{name} started on {target} without its "
                        f"state (not restored by torpor: {', '.join(cold)}); it is removed and "
                        f"the original left running (its checkpoint images: "
                        f"{', '.join(images.values())})")


def _delete_source(api: KubeApi, namespace: str, name: str, uid: str | None,
                   moved: str) -> None:
    """The original, only if it is still the pod that was checkpointed (same UID)."""
    try:
        now = api.pod(namespace, name)
        if uid and now["metadata"].get("uid") != uid:
            raise KubeError(f"{namespace}/{name} is another pod now (UID {now['metadata'].get('uid')}"
                            f", not {uid}): left as it is")
        api.delete(pod_path(namespace, name), f"deleting the original pod {namespace}/{name}")
    except KubeError as e:
        raise KubeError(f"{e}\nthe moved pod {namespace}/{moved} runs; the original was not "
                        "deleted") from None


def _agent_json(api: KubeApi, agent: str, args: list[str], what: str,
                timeout: float = 120) -> dict[str, Any]:
    """The node agent's JSON answer (torpor's --json, after any progress lines)."""
    out = api.run_agent(agent, args, what, timeout)
    start = 0 if out.startswith("{") else out.find("\n{")
    made: object = None
    if start >= 0:
        with contextlib.suppress(ValueError):
            made = json.loads(out[start:])
    if not isinstance(made, dict):
        raise KubeError(f"{what}: the node agent printed no result: {out[-300:]!r}")
    return made


def _image_on_node(api: KubeApi, agent: str, verb: str, archive: str, ref: str,
                   timeout_s: int) -> str:
    made = _agent_json(api, agent, [verb, archive, ref],
                       f"building the checkpoint image {ref} on the node", timeout_s + 60)
    reference = made.get("reference")
    if not isinstance(reference, str):
        raise KubeError(f"the node agent did not push {ref}: {made!r}")
    return reference


def _wait_running(api: KubeApi, namespace: str, name: str, timeout_s: int,
                  images: dict[str, str]) -> str:
    """Until every container runs, none restarted, and the pod is Ready; its UID."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = api.pod(namespace, name)
        why = failure_of(found)
        if why is None and is_running(found) and is_ready(found):
            return str(found["metadata"].get("uid", ""))
        if why is not None:
            raise KubeError(f"the moved pod {namespace}/{name} did not start: {why} "
                            f"(its checkpoint images: {', '.join(images.values())})")
        if time.monotonic() > deadline:
            raise KubeError(f"the moved pod {namespace}/{name} was not running and ready after "
                            f"{timeout_s}s (kubectl describe pod -n {namespace} {name}); its "
                            f"checkpoint images: {', '.join(images.values())}")
        time.sleep(0.5)


def _forget(api: KubeApi, agent: str, archive: str) -> None:
    _quietly(lambda: api.run_agent(agent, ["forget", archive], "removing " + archive, 60))


def _unpush(api: KubeApi, agent: str, image: str) -> None:
    _quietly(lambda: api.run_agent(agent, ["unpush", image], "deleting " + image, 120))


def _delete_new_pod(api: KubeApi, namespace: str, name: str) -> None:
    _quietly(lambda: api.delete(pod_path(namespace, name), f"deleting {namespace}/{name}",
                                grace_seconds=0))


def _quietly(step: Callable[[], object]) -> None:
    """An undo step: its own failure must not hide the error that made it run."""
    with contextlib.suppress(KubeError):
        step()
