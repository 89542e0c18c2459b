"""The Kubernetes API as `torpor kube migrate` reaches it: through `kubectl`, with the user's
kubeconfig and context, so every way a cluster authenticates (client certificates, tokens,
exec plugins such as EKS's and GKE's) works as it does for kubectl itself, and what the API
server says reaches the user verbatim. kubectl's failures become KubeError here and nowhere
else.

Reads and writes are raw API paths (`kubectl get|create|delete --raw`): the objects stay
plain JSON dicts, unknown fields survive. A node agent is reached with `kubectl exec`.
"""

from __future__ import annotations

import contextlib
import json
import select
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torpor.errors import KubeError

AGENT_NAMESPACE = "torpor-system"
AGENT_LABEL = "app.kubernetes.io/name=torpor-node-installer"
AGENT_CONTAINER = "install"
AGENT_SCRIPT = "/installer/torpor/packaging/kubernetes/node-agent.sh"
FREEZE_ANSWER_S = 120      # pausing a pod's containers: containerd answers in well under this


@dataclass(frozen=True)
class KubeApi:
    kubectl: str = "kubectl"
    kubeconfig: str | None = None
    context: str | None = None

    def _command(self) -> list[str]:
        program = shutil.which(self.kubectl)
        if program is None:
            raise KubeError(f"{self.kubectl}: not found: torpor kube migrate reaches the cluster "
                            "through kubectl (put it on PATH or give --kubectl)")
        cmd = [program]
        if self.kubeconfig:
            cmd += ["--kubeconfig", self.kubeconfig]
        if self.context:
            cmd += ["--context", self.context]
        return cmd

    def _run(self, args: Sequence[str], what: str, body: dict[str, Any] | None = None,
             timeout: float = 120) -> str:
        cmd = self._command()
        try:
            done = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout,
                                  input=json.dumps(body) if body is not None else None)
        except subprocess.TimeoutExpired:
            raise KubeError(f"{what}: no answer from kubectl in {timeout:.0f}s") from None
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip() or
                    f"kubectl exited with status {done.returncode}")
            raise KubeError(f"{what}: {said}")
        return done.stdout

    def _json(self, args: Sequence[str], what: str, body: dict[str, Any] | None = None,
              timeout: float = 120) -> dict[str, Any]:
        out = self._run(args, what, body, timeout)
        try:
            found = json.loads(out)
        except ValueError:
            raise KubeError(f"{what}: kubectl printed no JSON: {out[:200]!r}") from None
        if not isinstance(found, dict):
            raise KubeError(f"{what}: kubectl printed {type(found).__name__}, not an object")
        return found

    def get(self, path: str, what: str) -> dict[str, Any]:
        return self._json(["get", "--raw", path], what)

    def post(self, path: str, body: dict[str, Any], what: str,
             timeout: float = 120) -> dict[str, Any]:
        return self._json(["create", "--raw", path, "-f", "-"], what, body, timeout)

    def delete(self, path: str, what: str, grace_seconds: int | None = None) -> None:
        query = f"?gracePeriodSeconds={grace_seconds}" if grace_seconds is not None else ""
        self._run(["delete", "--raw", path + query], what)

    # what migrate asks -------------------------------------------------------------------------

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.get(pod_path(namespace, name), f"reading pod {namespace}/{name}")

    def node(self, name: str) -> dict[str, Any]:
        return self.get(f"/api/v1/nodes/{quote(name)}", f"reading node {name}")

    def runtime_class_handler(self, name: str) -> str | None:
        """The handler of RuntimeClass `name`; None where there is no such class."""
        try:
            found = self.get(f"/apis/node.k8s.io/v1/runtimeclasses/{quote(name)}",
                             f"reading RuntimeClass {name}")
        except KubeError as e:
            if "NotFound" in str(e) or "not found" in str(e):
                return None
            raise
        handler = found.get("handler")
        return handler if isinstance(handler, str) else None

    def agent_on(self, node: str) -> str:
        """The name of torpor's node agent pod on `node` (the node installer's, Ready)."""
        query = urllib.parse.urlencode({"labelSelector": AGENT_LABEL,
                                        "fieldSelector": f"spec.nodeName={node}"})
        found = self.get(f"/api/v1/namespaces/{AGENT_NAMESPACE}/pods?{query}",
                         f"looking for torpor's node agent on {node}")
        ready = [str(p["metadata"]["name"]) for p in found.get("items") or []
                 if is_ready(p) and not p["metadata"].get("deletionTimestamp")]
        if not ready:
            raise KubeError(
                f"no Ready torpor node agent on node {node} (pods labelled {AGENT_LABEL} in "
                f"{AGENT_NAMESPACE}): `kubectl label node {node} torpor.io/node=true` and apply "
                "packaging/kubernetes/node-installer.yaml (docs/kubernetes.md)")
        return sorted(ready)[0]

    def checkpoint(self, node: str, namespace: str, pod: str, container: str,
                   timeout_s: int) -> str:
        """kubelet's checkpoint API through the API server's node proxy: the archive's path
        on the node."""
        path = (f"/api/v1/nodes/{quote(node)}/proxy/checkpoint/{quote(namespace)}/{quote(pod)}/"
                f"{quote(container)}?timeout={timeout_s}")
        what = f"checkpointing container {container} of {namespace}/{pod} through kubelet on {node}"
        answer = self._json(["create", "--raw", path, "-f", "/dev/null"], what,
                            timeout=timeout_s + 30)
        items = answer.get("items")
        if not isinstance(items, list) or len(items) != 1 or not isinstance(items[0], str):
            raise KubeError(f"{what}: kubelet answered {answer!r}, not one archive")
        return items[0]

    def run_agent(self, agent: str, args: Sequence[str], what: str, timeout: float) -> str:
        """node-agent.sh ARGS in the agent pod (packaging/kubernetes/node-agent.sh); its
        output."""
        return self._run(["exec", "-n", AGENT_NAMESPACE, agent, "-c", AGENT_CONTAINER, "--",
                          "/bin/sh", AGENT_SCRIPT, *args], what, timeout=timeout)

    @contextlib.contextmanager
    def pod_frozen(self, agent: str, pod_uid: str, seconds: int) -> Iterator[str]:
        """The pod's containers held frozen on its node (`node-agent.sh freeze`) while the
        block runs; yields what the agent froze. The hold is kubectl's stdin: closing it, or
        kubectl going away, thaws the pod; so does the agent's own deadline, `seconds`, which
        fails the block (its checkpoints may not be of one instant)."""
        what = f"freezing pod {pod_uid} through {agent}"
        proc = subprocess.Popen(
            [*self._command(), "exec", "-i", "-n", AGENT_NAMESPACE, agent, "-c", AGENT_CONTAINER,
             "--", "/bin/sh", AGENT_SCRIPT, "freeze", pod_uid, str(seconds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], FREEZE_ANSWER_S)
        first = proc.stdout.readline().strip() if ready else ""
        if not first.startswith("frozen"):
            problem = _release(proc)
            raise KubeError(f"{what}: {problem or first or 'no answer'}")
        try:
            yield first.removeprefix("frozen").strip()
        except BaseException as e:
            problem = _release(proc)
            if problem:
                raise KubeError(f"{e}\n{what}: the pod may still be frozen: {problem}") from e
            raise
        problem = _release(proc)
        if problem:
            raise KubeError(f"{what}: the pod may still be frozen, or was thawed before its "
                            f"checkpoints were done: {problem}")


def _release(proc: subprocess.Popen[str]) -> str:
    """End a hold (close kubectl's stdin); what went wrong with the thaw, or "" when the agent
    said `thawed` and exited 0."""
    assert proc.stdin is not None
    with contextlib.suppress(OSError):
        proc.stdin.close()
    proc.stdin = None            # (communicate must not flush it)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    if proc.returncode == 0 and out.strip().endswith("thawed"):
        return ""
    return (err.strip() or out.strip() or f"kubectl exited with status {proc.returncode}")


def quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def pod_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{quote(namespace)}/pods"
    return f"{base}/{quote(name)}" if name else base


def is_ready(obj: dict[str, Any]) -> bool:
    """A pod's or a node's Ready condition is True."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
