"""Where a checkpoint lives, and how to reach a registry.

A source names a checkpoint in one of five places: a checkpoint directory (checkpoint.json), an
OCI image-layout directory (index.json), a kubelet checkpoint archive (a tar file with
config.dump and spec.dump, docs/kubernetes.md), a reference in the local store (`torpor ls`),
or a reference in a registry. Registry access comes from the command line, then the config.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path

from torpor.config import Config
from torpor.errors import ConfigError, ImageError, RestoreError
from torpor.formats import names
from torpor.formats.metadata import CheckpointMetadata
from torpor.image import kube_archive, unpack
from torpor.image.directory import is_checkpoint_dir
from torpor.image.store import Store
from torpor.ops.access import RegistryAccess
from torpor.registry import PullPlan, RegistryOptions, parse_reference


class SourceKind(enum.Enum):
    DIRECTORY = "dir"
    LAYOUT = "layout"
    STORE = "store"
    REGISTRY = "registry"
    KUBE_ARCHIVE = "kubelet-archive"


def kind_of(source: str, store: Store) -> SourceKind:
    if os.path.isdir(source):
        if is_checkpoint_dir(source):
            return SourceKind.DIRECTORY
        if os.path.exists(os.path.join(source, names.OCI_INDEX_FILE)):
            return SourceKind.LAYOUT
        raise ImageError(f"{source} is neither a checkpoint directory nor an OCI image layout")
    if os.path.isfile(source):
        if kube_archive.is_archive(source):
            return SourceKind.KUBE_ARCHIVE
        raise ImageError(f"{source} is a file, not a kubelet checkpoint archive")
    if store.has(source):
        return SourceKind.STORE
    not_here = f"{source}: no such file or directory, and not an image reference"
    if source.startswith(("/", "./", "../", "~")):   # a path, never a reference
        raise ImageError(not_here, hint=SOURCE_HINT)
    try:
        parse_reference(source)
    except ConfigError as error:
        raise ImageError(f"{not_here} ({error.message.rpartition(': ')[2]})",
                         hint=SOURCE_HINT) from None
    return SourceKind.REGISTRY


SOURCE_HINT = ("give a checkpoint directory, an OCI layout or a kubelet checkpoint archive that "
               "exists, a local image (torpor ls) or [registry[:port]/]repository[:tag]")


def registry_options(cfg: Config, ref: str, access: RegistryAccess) -> RegistryOptions:
    parsed = parse_reference(ref)
    insecure = access.insecure or parsed.registry in cfg.registry_insecure
    ca = access.ca_file or cfg.registry_ca_file or None
    return RegistryOptions(
        username=access.username, password=access.password,
        docker_config=Path(cfg.registry_docker_config) if cfg.registry_docker_config else None,
        ca_file=Path(ca) if ca else None, insecure=insecure,
        hosts_dir=Path(cfg.registry_hosts_dir) if cfg.registry_hosts_dir else None,
        registries_conf=Path(cfg.registry_registries_conf) if cfg.registry_registries_conf
        else None,
        parallel=max(4, os.cpu_count() or 1), manifest_limit=cfg.restore_max_manifest_bytes,
        config_limit=cfg.restore_max_config_bytes)


def tag_of(ref: str | None) -> str | None:
    if not ref:
        return None
    return parse_reference(ref).tag or "latest"


def mount_from(metadata: CheckpointMetadata, ref: str) -> list[str]:
    """The base image's repository, when it lives in the same registry (cross-repo mounts)."""
    if metadata.image is None:
        return []
    try:
        base, target = parse_reference(metadata.image.name), parse_reference(ref)
    except Exception:
        return []
    return [base.repository] if base.registry == target.registry else []


def image_of_plan(plan: PullPlan,
                  limits: unpack.ImageLimits | None = None) -> unpack.CheckpointImage:
    """The checkpoint image a registry pull plan describes (its metadata already fetched)."""
    manifests = {m.descriptor.digest: (m.descriptor, m.document) for m in plan.manifests}
    state = next((m for m in plan.manifests if unpack.is_state_manifest(m.document)), None)
    if state is None or state.config is None:
        raise ImageError(f"{plan.reference} is not a torpor checkpoint image")
    return unpack.assemble(plan.top.descriptor, plan.top.document, manifests, state.config,
                           limits or unpack.ImageLimits())


def check_download_space(plan: PullPlan, cfg: Config) -> None:
    """The layers must fit where they are downloaded, and within the limit."""
    total = sum(layer.descriptor.size for layer in plan.layers)
    os.makedirs(cfg.image_store, mode=0o700, exist_ok=True)
    st = os.statvfs(cfg.image_store)
    free = st.f_bavail * st.f_frsize
    if total > min(free, cfg.restore_max_unpacked_bytes):
        raise RestoreError(f"{plan.reference}'s layers are {total} bytes; {cfg.image_store} has "
                           f"{free} free (limit {cfg.restore_max_unpacked_bytes})")
