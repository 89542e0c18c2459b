"""The JSON documents of a checkpoint image (docs/format.md), built from descriptors alone: the
state manifest, the runnable image's config and manifest, and the index over both. Pure
functions: build.py writes what they return; tests check their shape without a container."""

from __future__ import annotations

import json
from typing import Any

from torpor.formats import annotations as ann
from torpor.formats import mediatypes as mt
from torpor.formats import names
from torpor.formats.oci import Descriptor, OciDocument

STATE_PLATFORM = {"architecture": "unknown", "os": "unknown"}


def canonical(document: OciDocument) -> bytes:
    """The bytes a document is stored and digested as: compact, keys sorted."""
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def state_manifest(config: Descriptor, layers: list[Descriptor], created: str,
                   container_id: str, extra: dict[str, str] | None = None) -> OciDocument:
    """`extra`: more annotations (the generation's figures, the estimate made before it)."""
    return {
        "schemaVersion": 2, "mediaType": mt.OCI_MANIFEST, "artifactType": mt.ARTIFACT_TYPE,
        "config": config.to_json(), "layers": [d.to_json() for d in layers],
        "annotations": {**(extra or {}), ann.CREATED: created, ann.CONTAINER: container_id,
                        ann.FORMAT: names.CHECKPOINT_FORMAT},
    }


def state_entry() -> dict[str, Any]:
    """What the index says of the state manifest, beside its descriptor."""
    return {"artifactType": mt.ARTIFACT_TYPE, "platform": dict(STATE_PLATFORM),
            "annotations": {ann.ROLE: ann.ROLE_STATE}}


RW_LAYER_COMMENT = "the container's read-write layer at checkpoint time"


CHECKPOINT_MARK = f"{names.CHECKPOINT_ENV}={names.CHECKPOINT_FORMAT}"


def runnable_config(base_config: OciDocument, diff_id: str | None, created: str,
                    container_id: str) -> OciDocument:
    """The base image's config, plus the read-write layer's diff ID and a history entry, and
    the checkpoint's mark in Env (torpor-runc create restores a container made from it, where
    the node's `[restore] on_create` says so)."""
    config: OciDocument = json.loads(json.dumps(base_config))
    run = config.setdefault("config", {})
    run["Env"] = [*unmarked(run.get("Env")), CHECKPOINT_MARK]
    if diff_id is not None:
        config.setdefault("rootfs", {"type": "layers", "diff_ids": []})
        config["rootfs"]["diff_ids"].append(diff_id)
        config.setdefault("history", []).append({
            "created": created, "created_by": f"torpor checkpoint {container_id}",
            "comment": RW_LAYER_COMMENT})
    return config


def ends_with_rw_layer(manifest: OciDocument, config: OciDocument) -> bool:
    """Whether this image is a checkpoint's runnable image whose last layer is the read-write
    layer torpor added (a container restored from it is checkpointed again)."""
    annotations = manifest.get("annotations")
    history = config.get("history")
    layers = manifest.get("layers")
    rootfs = config.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    return (isinstance(annotations, dict) and ann.CONTAINER in annotations
            and isinstance(history, list) and bool(history) and isinstance(history[-1], dict)
            and history[-1].get("comment") == RW_LAYER_COMMENT
            and isinstance(layers, list) and bool(layers)
            and isinstance(diff_ids, list) and len(diff_ids) == len(layers))


def without_rw_layer(config: OciDocument) -> OciDocument:
    """A runnable image's config as its base image had it: the last diff ID and history entry,
    torpor's read-write layer's, taken off."""
    base: OciDocument = json.loads(json.dumps(config))
    base["rootfs"]["diff_ids"].pop()
    base["history"].pop()
    run = base.get("config")
    if isinstance(run, dict) and "Env" in run:
        run["Env"] = unmarked(run["Env"])
    return base


def unmarked(env: object) -> list[str]:
    """An image config's Env without the checkpoint's mark."""
    items = env if isinstance(env, list) else []
    return [e for e in items if not (isinstance(e, str)
                                     and e.startswith(names.CHECKPOINT_ENV + "="))]


def runnable_manifest(config: Descriptor, layers: list[dict[str, Any]], created: str,
                      base_name: str, base_digest: str, container_id: str) -> OciDocument:
    return {
        "schemaVersion": 2, "mediaType": mt.OCI_MANIFEST, "config": config.to_json(),
        "layers": layers,
        "annotations": {ann.CREATED: created, ann.BASE_NAME: base_name,
                        ann.BASE_DIGEST: base_digest, ann.CONTAINER: container_id},
    }


def runnable_entry(config: OciDocument) -> dict[str, Any]:
    platform = {"architecture": config.get("architecture", "amd64"),
                "os": config.get("os", "linux")}
    return {"platform": platform, "annotations": {ann.ROLE: ann.ROLE_RUNNABLE}}


def index(runnable: Descriptor, state: Descriptor, created: str, container_id: str,
          base_name: str) -> OciDocument:
    return {
        "schemaVersion": 2, "mediaType": mt.OCI_INDEX,
        "manifests": [runnable.to_json(), state.to_json()],
        "annotations": {ann.CREATED: created, ann.CONTAINER: container_id,
                        ann.FORMAT: names.CHECKPOINT_FORMAT, ann.BASE_NAME: base_name},
    }
