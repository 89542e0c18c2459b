"""`torpor pull REF`: a checkpoint image from a registry into the local store (or an OCI layout
with -o DIR).

Steps: 1. fetch the index, manifests and metadata, and check that it is a torpor checkpoint;
2. download every layer (in parallel, resuming dropped transfers, each digest-checked) into the
layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torpor.config import Config
from torpor.image.store import Store
from torpor.ops.access import NO_CREDENTIALS, RegistryAccess
from torpor.ops.sources import image_of_plan, registry_options
from torpor.registry import fetch_metadata
from torpor.reporting import SILENT, Progress


@dataclass(frozen=True)
class PullResult:
    reference: str
    layout: str
    container: str
    downloaded: int
    bytes_downloaded: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def pull(ref: str, cfg: Config, out: str | None = None, access: RegistryAccess = NO_CREDENTIALS,
         progress: Progress = SILENT) -> PullResult:
    store = Store(cfg.image_store)
    with fetch_metadata(ref, registry_options(cfg, ref, access)) as plan:
        image = image_of_plan(plan)
        layout = out or str(store.prepare(ref))
        progress.step(f"downloading {len(plan.layers)} layers")
        result = plan.download(layout, progress=progress.transfer("downloaded"))
    return PullResult(str(result.reference), layout, image.metadata.container.id,
                      result.downloaded, result.bytes_downloaded)
