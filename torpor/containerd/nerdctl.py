"""What nerdctl adds to the containerd containers it runs, as far as torpor needs it: the name
label, the OCI hooks that run nerdctl itself, the files it bind-mounts from its data root, and
where `nerdctl checkpoint create` leaves a checkpoint.

nerdctl keeps a checkpoint in <data-root>/checkpoints/NAME, whatever the container
(`--checkpoint-dir` replaces <data-root>/checkpoints). Its createRuntime and postStop hooks run
`nerdctl --address=... --data-root=... internal oci-hook STAGE` with the whole environment of
the `nerdctl run` that made them: they set up and tear down the container's CNI networks on this
node. /etc/hosts, /etc/resolv.conf and /etc/hostname are files of its data root, bind-mounted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from torpor.containerd.api import containers_pb2
from torpor.containerd.client import Client
from torpor.errors import CheckpointError, NotFound
from torpor.formats.oci import OciSpec

DATA_ROOT = "/var/lib/nerdctl"             # nerdctl's own default, as root
NAME_LABEL = "nerdctl/name"
ENGINE_FILES = ("/etc/hosts", "/etc/resolv.conf", "/etc/hostname")


@dataclass(frozen=True)
class EngineFile:
    """A file nerdctl made and bind-mounts into the container."""

    destination: str
    source: str
    read_only: bool


def checkpoint_path(checkpoint: str, checkpoints_in: str | None = None,
                    data_root: str = DATA_ROOT) -> str:
    """nerdctl's directory for CHECKPOINT: a path as given, else NAME under `checkpoints_in`
    (nerdctl's --checkpoint-dir; default <data-root>/checkpoints)."""
    if "/" in checkpoint or checkpoint in (".", ".."):
        return os.path.abspath(checkpoint)
    return os.path.join(checkpoints_in or os.path.join(data_root, "checkpoints"), checkpoint)


def find_container(client: Client, wanted: str) -> containers_pb2.Container:
    """By containerd ID, else nerdctl name, else a unique ID prefix (as nerdctl resolves)."""
    try:
        return client.get_container(wanted)
    except NotFound:
        pass
    found = client.list_containers(f'labels."{NAME_LABEL}"=={wanted}')
    if not found:
        found = [c for c in client.list_containers() if c.id.startswith(wanted)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise NotFound(f"no container {wanted} in namespace {client.namespace}",
                       hint="the container must still exist (nerdctl restores into it, and torpor "
                       "takes its spec and image from it); give torpor nerdctl's --address and "
                       "--namespace")
    raise CheckpointError(f"{wanted} names {len(found)} containers: "
                          f"{', '.join(sorted(c.id[:12] for c in found))}",
                          hint="give the full container ID")


def without_nerdctl_hooks(spec: OciSpec) -> tuple[OciSpec, int]:
    """A copy of the spec without nerdctl's own OCI hooks, and how many there were."""
    out: OciSpec = json.loads(json.dumps(spec))
    dropped = 0
    hooks: dict[str, Any] = out.get("hooks") or {}
    for stage in list(hooks):
        kept = [h for h in hooks[stage] or [] if not is_nerdctl_hook(h)]
        dropped += len(hooks[stage] or []) - len(kept)
        if kept:
            hooks[stage] = kept
        else:
            del hooks[stage]
    if "hooks" in out and not hooks:
        del out["hooks"]
    return out, dropped


def is_nerdctl_hook(hook: dict[str, Any]) -> bool:
    args = [str(a) for a in hook.get("args") or []]
    return os.path.basename(str(hook.get("path", ""))).startswith("nerdctl") and \
        "internal" in args and "oci-hook" in args


def engine_files(spec: OciSpec) -> list[EngineFile]:
    """/etc/hosts, /etc/resolv.conf and /etc/hostname where they are bind-mounted files."""
    found = []
    for mount in spec.get("mounts") or []:
        options = mount.get("options") or []
        bind = mount.get("type") == "bind" or "bind" in options or "rbind" in options
        source = str(mount.get("source", ""))
        if mount.get("destination") in ENGINE_FILES and bind and os.path.isfile(source):
            found.append(EngineFile(str(mount["destination"]), source, "ro" in options))
    return found
