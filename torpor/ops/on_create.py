"""The checkpoint behind a container created from a checkpoint image (restore on create).

torpor-runc `create` calls this where `[restore] on_create` is on and the container's spec carries
the runnable image's mark (names.CHECKPOINT_ENV). Steps, in order, before anything large is
downloaded, and nothing left behind when one fails:
 1. which image: the container's image in containerd (its name, and the index digest containerd
    pulled), from the containerd that runs the shim (containerd_address); the image must be a
    torpor checkpoint image;
 2. its index and metadata from the registry, pinned to that digest, the signature checked on
    the index first: `[restore] on_create = "signed"` requires a signature by a trusted key (or
    this node's own checkpoint) whatever `[restore] signatures` says, "on" leaves it to that;
 3. this node against the checkpoint (architecture, kernel, CPU, CRIU, runc, cgroups, GPUs),
    and an encrypted checkpoint's keys: the node's own, `[restore] decryption_keys`;
 4. the layers into the node's store (those it already holds are linked, not downloaded);
 5. the state layers unpacked into `directory` (CRIU's images, torpor-runc's state).
The spec runc restores with, and CRIU's images against it, are checked by torpor-runc restore
(shim/restore_cmd.py), as for every restore. The registry answers for the image: a checkpoint
is code and kernel state, so the node reads it only where it can check its signature.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from torpor import signing
from torpor.config import Config
from torpor.containerd.client import Client
from torpor.containerd.images import chain_ids
from torpor.errors import ConfigError, NotFound, RestoreError
from torpor.formats.metadata import CheckpointMetadata
from torpor.formats.node import NodeFacts
from torpor.image import unpack
from torpor.image.encryption_keys import node_keys
from torpor.image.store import Store
from torpor.node import compat, facts
from torpor.ops import generation
from torpor.ops.access import RegistryAccess
from torpor.ops.sources import check_download_space, image_of_plan, registry_options
from torpor.registry import fetch_metadata, parse_reference

MODES = ("off", "signed", "on")


@dataclass(frozen=True)
class CheckpointSource:
    """The image a container was created from, as containerd has it."""

    name: str             # the image's name, a registry reference
    index_digest: str     # what containerd pulled under it
    rootfs_parent: str = ""   # the chain ID the container's root filesystem was made on

    @property
    def pinned(self) -> str:
        return str(parse_reference(self.name).with_digest(self.index_digest))


def mode(cfg: Config) -> str:
    if cfg.restore_on_create not in MODES:
        raise ConfigError(f'[restore] on_create is "{cfg.restore_on_create}"',
                          hint='say "off", "signed" or "on"')
    return cfg.restore_on_create


def containerd_address(environ: dict[str, str] | os._Environ[str]) -> str:
    """containerd's gRPC socket, which containerd gives its shims (2.x: GRPC_ADDRESS), or its
    ttrpc one (1.6, 1.7: TTRPC_ADDRESS, the gRPC socket's path plus ".ttrpc")."""
    if environ.get("GRPC_ADDRESS"):
        return environ["GRPC_ADDRESS"]
    ttrpc = environ.get("TTRPC_ADDRESS", "")
    if not ttrpc.endswith(".ttrpc"):
        raise RestoreError("torpor-runc create cannot tell which containerd runs this container "
                           "(no GRPC_ADDRESS or TTRPC_ADDRESS from containerd's shim): restore "
                           "on create works under containerd only",
                           hint="create it cold with the annotation "
                                "io.torpor.restore.cold-start=true, or restore with torpor restore")
    return ttrpc.removesuffix(".ttrpc")


def source_of(address: str, namespace: str, container_id: str) -> CheckpointSource:
    """Step 1: the container's image in containerd."""
    with Client(address, namespace) as client:
        return _source_of(client, container_id)


def _source_of(client: Client, container_id: str) -> CheckpointSource:
    try:
        container = client.get_container(container_id)
    except NotFound:
        raise RestoreError(f"containerd has no container {container_id}") from None
    if not container.image:
        raise RestoreError(f"the container {container_id} names no image in containerd: its "
                           "spec carries a checkpoint image's mark, but torpor cannot tell which")
    try:
        image = client.get_image(container.image)
    except NotFound:
        raise RestoreError(f"the image {container.image} is not in containerd") from None
    parent = ""
    if container.snapshotter and container.snapshot_key:
        try:
            parent = client.stat_snapshot(container.snapshotter, container.snapshot_key).parent
        except NotFound:
            pass
    return CheckpointSource(container.image, image.target.digest, parent)


def check_rootfs(source: CheckpointSource, image: unpack.CheckpointImage, layout: str) -> None:
    """The container's root filesystem was made from the signed checkpoint's runnable image,
    not from another image that took its name between the container's creation and now
    (its snapshot's parent is the chain of the runnable config's layers)."""
    config = image.runnable_blobs[0]
    algorithm, hex_part = config.digest.split(":", 1)
    with open(os.path.join(layout, "blobs", algorithm, hex_part), "rb") as f:
        diff_ids = (json.load(f).get("rootfs") or {}).get("diff_ids") or []
    chain = chain_ids([str(d) for d in diff_ids])
    if source.rootfs_parent and chain and chain[-1] != source.rootfs_parent:
        raise RestoreError(f"the container's root filesystem was made from another image than "
                           f"the checkpoint {source.pinned} (its layers' chain "
                           f"{source.rootfs_parent}, the checkpoint's {chain[-1]}): {source.name} "
                           "was pulled again after the container was created",
                           hint="create the container again")


def fetch_checkpoint(cfg: Config, source: CheckpointSource, directory: str,
                     runc: str) -> tuple[CheckpointMetadata, signing.SignatureCheck]:
    """Steps 2 to 5: the checkpoint unpacked into `directory` (which must not exist)."""
    required_by = '[restore] on_create is "signed"' if mode(cfg) == "signed" else ""
    store = Store(cfg.image_store)
    limits = unpack.ImageLimits.of(cfg)
    ref = source.pinned
    signed: list[signing.SignatureCheck] = []
    with store.scratch() as scratch, \
            fetch_metadata(ref, registry_options(cfg, ref, RegistryAccess()),
                           signing.checker(cfg, source.name, signed, required_by)) as plan:
        image = image_of_plan(plan, limits)
        compat.check(image.metadata, cfg, this_node(runc))
        keys = node_keys(cfg) if image.encrypted else ()   # no one gives any here
        unpack.check_keys(image, keys)
        check_download_space(plan, cfg)
        wanted = [layer for layer in plan.layers if layer.descriptor == image.metadata_layer]
        if wanted:   # an encrypted image's whole metadata: one small layer, first
            plan.download(str(scratch / "metadata"), wanted)
        metadata = unpack.full_metadata(image, str(scratch / "metadata"), keys, str(scratch),
                                        limits)
        unpack.ensure_restorable(metadata)
        with store.downloading(plan.top.descriptor.digest), \
                store.staging(source.name) as staged:
            held = generation.hold_for_pull(plan, store, scratch / "held")
            layers = generation.place_for_pull(plan, held, staged)
            plan.download(staged, layers)
    check_rootfs(source, image, str(store.layout(source.name)))
    unpack.unpack_state(image, str(store.layout(source.name)), directory, keys=keys,
                        limits=limits, metadata=metadata)
    return metadata, signed[0]


def this_node(runc: str) -> NodeFacts:
    """This node as the restore will meet it: the runc torpor-runc runs, CRIU on PATH."""
    criu = facts.which("criu")
    return facts.gather(versions=(facts.version_str(facts.runc_version(runc)),
                                  facts.version_str(facts.criu_version(criu))
                                  if criu else "unknown"))
