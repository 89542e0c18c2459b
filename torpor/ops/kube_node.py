"""`torpor kube node`: how this node restores a pod from a checkpoint image, which is what
`torpor kube migrate` asks the target's node agent before it makes anything.

- containerd 2.1 to 2.3 restore through CreateContainer themselves, from the image `torpor kube
  image` makes (kubelet's archive in one layer, org.criu.checkpoint.container.name): "cri"
  (2.2.7+ and 2.3.4+ only with enable_experimental_restore_via_create, which the node installer
  sets);
- any other containerd (1.6, 1.7, 2.0, 2.4 and later) restores only through torpor's restore on
  create, from a torpor checkpoint image (`torpor kube import --push`), where `[restore]
  on_create` is "signed" or "on": "on-create"; where it is "off": "none".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torpor.config import Config
from torpor.containerd.client import Client
from torpor.errors import ConfigError
from torpor.node.facts import parse_version, version_str
from torpor.ops.access import RegistryAccess

CRI_RESTORE = ((2, 1), (2, 4))     # containerd versions whose CRI restores through create


@dataclass(frozen=True)
class PodRestore:
    containerd: str          # e.g. "2.4.0"
    restore: str             # "cri", "on-create" or "none"
    on_create: str           # [restore] on_create: "off", "signed" or "on"
    signs: bool              # this node signs what it pushes ([image] signing_key)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def pod_restore(client: Client, cfg: Config) -> PodRestore:
    version = parse_version(client.version().version)
    if CRI_RESTORE[0] <= version[:2] < CRI_RESTORE[1]:
        restore = "cri"
    else:
        restore = "on-create" if cfg.restore_on_create in ("signed", "on") else "none"
    return PodRestore(version_str(version), restore, cfg.restore_on_create,
                      bool(cfg.image_signing_key))


def restored(client: Client, cfg: Config, pod_uid: str) -> tuple[list[str], list[str]]:
    """The names of the pod's running containers that torpor-runc restored at create on this
    node (its records: torpor.shim.create_cmd.record), and of those it did not."""
    import os

    from torpor.formats import names
    from torpor.ops.pod_freeze import CRI_NAMESPACE, pod_containers

    records = os.path.join(cfg.runtime_state_dir, names.RESTORED_RECORDS)
    done: list[str] = []
    cold: list[str] = []
    for c in pod_containers(client, pod_uid):
        was = os.path.exists(os.path.join(records, f"{CRI_NAMESPACE}-{c.id}"))
        (done if was else cold).append(c.name)
    return done, cold


def unpush(cfg: Config, refs: list[str], access: RegistryAccess) -> list[str]:
    """Delete the images `refs` (each REPO:TAG@DIGEST or REPO@DIGEST) from their registry, as a
    migration that failed removes what it pushed (they hold the workload's memory); the
    references deleted (a registry that refuses deletes raises RegistryError)."""
    from torpor.ops.sources import registry_options
    from torpor.registry import parse_reference
    from torpor.registry.tags import delete_images

    gone = []
    for ref in refs:
        parsed = parse_reference(ref)
        if not parsed.digest:
            raise ConfigError(f"{ref}: name the image by its digest (REPO@sha256:...)")
        deleted = delete_images(parsed, [parsed.digest], keep=(), listed=(),
                                options=registry_options(cfg, ref, access))
        if deleted.images:
            gone.append(ref)
    return gone
