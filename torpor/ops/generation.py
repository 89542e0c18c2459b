"""What a new checkpoint image builds on, and the blobs a pull need not download.

`basis()`: the previous generation in the local store (image/generations.py: the image the
container was restored from, the same reference, the same container, the same repository; only
a chunk index the node wrote or verified: image/sound_indexes.py), its packs held for the
build, and the annotations of the estimate `torpor estimate` made for this checkpoint, if it
made one against that same previous generation within the hour.

`hold_for_pull()`, `place_for_pull()`: the layers of a pull plan that some image in the local
store already holds, linked into the target layout; the plan then downloads the others only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from torpor.config import Config
from torpor.containerd.client import Client
from torpor.errors import ContainerdError
from torpor.formats import annotations as ann
from torpor.formats import timestamps
from torpor.image.generations import Previous, hold_previous, hold_store_blobs, place
from torpor.image.store import Store
from torpor.ops.estimate import saved_estimate
from torpor.registry import Layer, PullPlan

ESTIMATE_FRESH_S = 3600


@dataclass(frozen=True)
class Basis:
    previous: Previous | None
    annotations: dict[str, str] = field(default_factory=dict)


def basis(client: Client, cfg: Config, store: Store, container_id: str, image_name: str,
          ref: str | None, hold: Path) -> Basis:
    index_digest = None
    if image_name:
        try:
            index_digest = client.get_image(image_name).labels.get(ann.IMAGE_CHECKPOINT)
        except ContainerdError:
            pass
    previous = hold_previous(store, hold, index_digest=index_digest, ref=ref,
                             container_id=container_id)
    notes: dict[str, str] = {}
    made = saved_estimate(cfg, client.namespace, container_id)
    if made is not None and made.previous == (previous.index_digest if previous else ""):
        made_at = timestamps.epoch(made.created)
        age = time.time() - made_at if made_at is not None else ESTIMATE_FRESH_S + 1
        if 0 <= age <= ESTIMATE_FRESH_S:
            notes = {ann.ESTIMATE_FULL: str(made.full_bytes), ann.ESTIMATE_NEW: str(made.new_bytes),
                     ann.ESTIMATE_AT: made.created}
    return Basis(previous, notes)


def hold_for_pull(plan: PullPlan, store: Store, hold: Path) -> dict[str, Path]:
    """The plan's layers some image in the store holds, linked under `hold` (on the store's
    filesystem), before the store entry the pull replaces is removed."""
    return hold_store_blobs(store, [layer.descriptor for layer in plan.layers], hold)


def place_for_pull(plan: PullPlan, held: dict[str, Path], layout_dir: str | Path) -> list[Layer]:
    """Link the held layers into the layout; the layers still to download."""
    place(held, layout_dir)
    return [layer for layer in plan.layers if layer.descriptor.digest not in held]
