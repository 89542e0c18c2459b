"""What `torpor checkpoint -t`, `restore REF`, `push`, `pull`, `inspect`, `ls` and `rm` do.

A source names a checkpoint in one of four places: a checkpoint directory (checkpoint.json), an
OCI image-layout directory (index.json), a reference in the local store (`torpor ls`), or a
reference in a registry. Restores from a registry fetch the index, manifests and metadata first
and check this node before any layer is downloaded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torpor.config import Config
from torpor.containerd.client import Client
from torpor.errors import ImageError
from torpor.image import build as image_build
from torpor.image import directory as checkpoint_dir
from torpor.image import unpack
from torpor.image.store import Store
from torpor.node import compat
from torpor.ops.checkpoint import CheckpointOptions, checkpoint
from torpor.ops.restore import RestoreOptions, restore
from torpor.registry import (
    EarlyBlobs,
    RegistryOptions,
    fetch_metadata,
    parse_reference,
    push_layout,
)
from torpor.registry.descriptors import Descriptor

Progress = Callable[[str], None]


def _transfer(progress: Progress, label: str) -> Any:
    """A byte-progress callback when the step reporter draws them (a terminal), else None."""
    make = getattr(progress, "transfer", None)
    return make(label) if make is not None else None


@dataclass
class RegistryFlags:
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    insecure: bool = False


def registry_options(cfg: Config, ref: str, flags: RegistryFlags) -> RegistryOptions:
    parsed = parse_reference(ref)
    insecure = flags.insecure or parsed.registry in cfg.registry_insecure
    ca = flags.ca_file or cfg.registry_ca_file or None
    return RegistryOptions(
        username=flags.username, password=flags.password,
        docker_config=Path(cfg.registry_docker_config) if cfg.registry_docker_config else None,
        ca_file=Path(ca) if ca else None, insecure=insecure,
        parallel=max(4, os.cpu_count() or 1))


def kind_of(source: str, store: Store) -> str:
    if os.path.isdir(source):
        if os.path.exists(os.path.join(source, checkpoint_dir.METADATA)):
            return "dir"
        if os.path.exists(os.path.join(source, "index.json")):
            return "layout"
        raise ImageError(f"{source} is neither a checkpoint directory nor an OCI image layout")
    if store.has(source):
        return "store"
    return "registry"


# Checkpoint into an image --------------------------------------------------------------------

def checkpoint_image(client: Client, container_id: str, cfg: Config, options: CheckpointOptions,
                     *, ref: str | None, layout_dir: str | None, push: bool,
                     flags: RegistryFlags, progress: Progress) -> dict[str, Any]:
    """Checkpoint, build the image (in the store under `ref`, or at `layout_dir`), push it."""
    store = Store(cfg.image_store)
    started = time.monotonic()
    options_for_push = registry_options(cfg, ref, flags) if push and ref else None
    with store.scratch() as scratch:
        directory = str(scratch / "checkpoint")
        metadata = checkpoint(client, container_id, directory, options, cfg, progress)
        checkpoint_s = time.monotonic() - started
        target = layout_dir or str(store.prepare(ref or ""))
        t = time.monotonic()
        if options_for_push is not None and ref:
            # each layer goes up as soon as it is compressed, while the next ones compress
            progress(f"compressing layers (zstd, in parallel) and pushing them to {ref}")
            mount = _mount_from(metadata, ref)
            with EarlyBlobs(ref, options_for_push, mount) as early:
                built = image_build.build(client, directory, target, ref_name=_tag_of(ref),
                                          level=cfg.image_zstd_level, on_blob=early.submit)
        else:
            progress("compressing layers (zstd, in parallel)")
            built = image_build.build(client, directory, target, ref_name=_tag_of(ref),
                                      level=cfg.image_zstd_level)
        build_s = time.monotonic() - t
    result: dict[str, Any] = {
        "container": container_id, "ref": ref, "layout": str(built.layout),
        "digest": built.index.digest, "raw_bytes": built.raw_bytes,
        "compressed_bytes": built.compressed_bytes, "sizes": metadata["sizes"],
        "timings": {"checkpoint_s": checkpoint_s, "build_s": build_s}}
    if options_for_push is not None and ref:
        progress(f"pushing the manifests of {ref}")
        t = time.monotonic()
        pushed = push_layout(built.layout, ref, options=options_for_push,
                             mount_from=_mount_from(metadata, ref))
        result["timings"]["push_s"] = time.monotonic() - t
        result["pushed"] = {"reference": str(pushed.reference), "uploaded": pushed.uploaded,
                            "mounted": pushed.mounted, "existing": pushed.existing,
                            "bytes_uploaded": pushed.bytes_uploaded}
    result["timings"]["total_s"] = time.monotonic() - started
    return result


def _tag_of(ref: str | None) -> str | None:
    if not ref:
        return None
    parsed = parse_reference(ref)
    return parsed.tag or "latest"


def _mount_from(metadata: dict[str, Any], ref: str) -> list[str]:
    """The base image's repository, when it lives in the same registry (cross-repo mounts)."""
    base = (metadata.get("image") or {}).get("name")
    if not base:
        return []
    try:
        base_ref, target = parse_reference(base), parse_reference(ref)
    except Exception:
        return []
    return [base_ref.repository] if base_ref.registry == target.registry else []


# Push and pull -------------------------------------------------------------------------------

def push(client: Client | None, source: str, ref: str, cfg: Config, flags: RegistryFlags,
         progress: Progress) -> dict[str, Any]:
    store = Store(cfg.image_store)
    kind = kind_of(source, store)
    if kind == "registry":
        raise ImageError(f"{source} is not a local checkpoint", hint="see `torpor ls`")
    with store.scratch() as scratch:
        if kind == "dir":
            if client is None:
                raise ImageError("packing a checkpoint directory needs containerd (its base image)")
            progress("compressing layers (zstd, in parallel)")
            layout = str(image_build.build(client, source, str(scratch / "layout"),
                                           ref_name=_tag_of(ref), level=cfg.image_zstd_level).layout)
        else:
            layout = source if kind == "layout" else str(store.layout(source))
        progress(f"pushing {ref}")
        pushed = push_layout(layout, ref, options=registry_options(cfg, ref, flags),
                             progress=_transfer(progress, "uploaded"))
    return {"reference": str(pushed.reference), "digest": pushed.digest,
            "uploaded": pushed.uploaded, "mounted": pushed.mounted, "existing": pushed.existing,
            "bytes_uploaded": pushed.bytes_uploaded}


def pull(ref: str, cfg: Config, flags: RegistryFlags, out: str | None,
         progress: Progress) -> dict[str, Any]:
    store = Store(cfg.image_store)
    with fetch_metadata(ref, registry_options(cfg, ref, flags)) as plan:
        image = _image_of_plan(plan)
        layout = out or str(store.prepare(ref))
        progress(f"downloading {len(plan.layers)} layers")
        result = plan.download(layout, progress=_transfer(progress, "downloaded"))
    return {"reference": str(result.reference), "layout": layout,
            "container": image.metadata["container"]["id"], "downloaded": result.downloaded,
            "bytes_downloaded": result.bytes_downloaded}


def _image_of_plan(plan: Any) -> unpack.CheckpointImage:
    top = plan.top
    manifests = {m.descriptor.digest: (m.descriptor, m.document) for m in plan.manifests}
    state = next((m for m in plan.manifests
                  if m.artifact_type == "application/vnd.torpor.checkpoint.v1"), None)
    if state is None or state.config is None:
        raise ImageError(f"{plan.reference} is not a torpor checkpoint image")
    return unpack.assemble(top.descriptor, top.document, manifests, state.config)


# Restore ------------------------------------------------------------------------------------

def restore_any(client: Client, source: str, options: RestoreOptions, cfg: Config,
                flags: RegistryFlags, progress: Progress) -> dict[str, Any]:
    store = Store(cfg.image_store)
    kind = kind_of(source, store)
    if kind == "dir":
        metadata = checkpoint_dir.load(source)
        compat.check(metadata, cfg)
        return restore(client, source, options, cfg, progress)
    started = time.monotonic()
    timings: dict[str, float] = {}
    ref: str | None = None
    if kind == "registry":
        ref = source
        progress(f"fetching {source}'s index and metadata")
        with fetch_metadata(source, registry_options(cfg, source, flags)) as plan:
            image = _image_of_plan(plan)
            progress("checking this node against the checkpoint")
            compat.check(image.metadata, cfg)  # before any layer is downloaded
            layout = str(store.prepare(source))
            progress(f"downloading {len(plan.layers)} layers")
            t = time.monotonic()
            plan.download(layout, progress=_transfer(progress, "downloaded"))
            timings["pull_s"] = time.monotonic() - t
    else:
        if kind == "store":
            ref, layout = source, str(store.layout(source))
        else:
            layout = source
        image = unpack.open_layout(layout)
        compat.check(image.metadata, cfg)
    unpack.ensure_restorable(image)
    name = ref or f"torpor.local/checkpoint/{image.metadata['container']['id']}:" \
                  f"{image.index.digest.split(':')[1][:12]}"
    with store.scratch() as scratch:
        progress("unpacking the CRIU images")
        t = time.monotonic()
        directory = str(scratch / "checkpoint")
        unpack.unpack_state(image, layout, directory)
        with client.lease():
            progress(f"importing the runnable image {name} into containerd")
            chain = unpack.import_runnable(client, image, layout, name)
            timings["unpack_s"] = time.monotonic() - t
            result = restore(client, directory, options, cfg, progress, rootfs_image=chain)
    result["source"] = source
    result["timings"] = {**timings, **result["timings"], "total_s": time.monotonic() - started}
    return result


# Inspect, ls, rm ----------------------------------------------------------------------------

def inspect(source: str, cfg: Config, flags: RegistryFlags) -> dict[str, Any]:
    store = Store(cfg.image_store)
    kind = kind_of(source, store)
    layers: list[Descriptor] = []
    if kind == "dir":
        metadata = checkpoint_dir.load(source)
        digest = None
    elif kind == "registry":
        with fetch_metadata(source, registry_options(cfg, source, flags)) as plan:
            image = _image_of_plan(plan)
    else:
        image = unpack.open_layout(source if kind == "layout" else str(store.layout(source)))
    if kind != "dir":
        metadata, digest = image.metadata, image.index.digest
        layers = image.state_layers + image.runnable_blobs[1:]
    return summarize(metadata, kind, source, digest, layers)


def summarize(metadata: dict[str, Any], kind: str, source: str, digest: str | None,
              layers: list[Descriptor]) -> dict[str, Any]:
    state = metadata.get("state") or {}
    network = state.get("network") or {}
    container = metadata.get("container") or {}
    gpu = state.get("gpu") or {}
    return {
        "source": source, "kind": kind, "digest": digest,
        "container": container.get("id"), "image": (metadata.get("image") or {}).get("name"),
        "created": metadata.get("created"), "torpor_version": metadata.get("torpor_version"),
        "options": metadata.get("options"), "sizes": metadata.get("sizes"),
        "timings": metadata.get("timings"), "node": metadata.get("node"),
        "criu_flags": state.get("criu_flags"),
        "network": {"links": [{k: link.get(k) for k in ("ifname", "kind", "address", "mtu",
                                                          "state")}
                              for link in (network.get("config") or {}).get("links", [])],
                    "addresses": [f"{a['address']}/{a['prefixlen']} ({a['ifname']})"
                                  for a in (network.get("config") or {}).get("addresses", [])],
                    "sockets": network.get("sockets", []),
                    "netns_path": network.get("netns_path")},
        "mounts": [{k: m.get(k) for k in ("destination", "type", "source")}
                   for m in (container.get("spec") or {}).get("mounts", [])],
        "files": state.get("files"),
        "processes": _process_tree(metadata),
        "gpus": gpu,
        "layers": [{"mediaType": d.media_type, "digest": d.digest, "size": d.size,
                    **({"part": d.annotations[k]} if (k := "io.torpor.checkpoint.part")
                       in d.annotations else {})} for d in layers],
    }


def _process_tree(metadata: dict[str, Any]) -> list[dict[str, Any]]:
    return list((metadata.get("state") or {}).get("processes") or [])


def ls(cfg: Config) -> list[dict[str, Any]]:
    return Store(cfg.image_store).entries()


def rm(cfg: Config, refs: list[str]) -> None:
    store = Store(cfg.image_store)
    for ref in refs:
        store.remove(ref)
