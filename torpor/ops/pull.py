"""`torpor pull REF`: a checkpoint image from a registry into the local store (or an OCI layout
with -o DIR).

Steps: 1. fetch the index and check its signatures against the node's policy (torpor.signing),
then the manifests and metadata, and check that it is a torpor checkpoint
within the limits of `[restore]`, that the decryption keys (if any) open every encrypted layer
and that the layers fit on disk; 2. link the layers some image of the store already holds
(packs of earlier generations) and download the others (in parallel, resuming dropped
transfers, each digest-checked) into a new layout beside the store's current copy of REF; 3.
with decryption keys: decrypt the layers in the layout (image.encrypt_layout.decrypt_layout),
each checked before anything changes; 4. the new layout replaces the store's copy of REF in one
rename: a failed pull leaves the previous copy as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torpor import output_path, signing, tally
from torpor.config import Config
from torpor.errors import ImageError
from torpor.image import encrypt_layout, unpack
from torpor.image.encryption_keys import DecryptionKey
from torpor.image.store import Store
from torpor.ops import generation
from torpor.ops.access import NO_CREDENTIALS, RegistryAccess
from torpor.ops.sources import check_download_space, image_of_plan, registry_options, tag_of
from torpor.registry import fetch_metadata
from torpor.reporting import SILENT, Progress


@dataclass(frozen=True)
class PullResult:
    reference: str
    layout: str
    container: str
    downloaded: int
    bytes_downloaded: int
    encrypted: bool = False        # the layout holds encrypted layers
    signature: str = ""            # what the signature check found (torpor.signing)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def pull(ref: str, cfg: Config, out: str | None = None, access: RegistryAccess = NO_CREDENTIALS,
         progress: Progress = SILENT, keys: Sequence[DecryptionKey] = ()) -> PullResult:
    store = Store(cfg.image_store)
    if out is not None:  # a layout holds the checkpoint's memory: only root and the user reach it
        output_path.prepare_dir(out, "the checkpoint image", ImageError, must_be_empty=False,
                                create=False)
    signed: list[signing.SignatureCheck] = []   # checked on the index, first
    with fetch_metadata(ref, registry_options(cfg, ref, access),
                        signing.checker(cfg, ref, signed)) as plan:
        progress.step(signed[0].describe())
        image = image_of_plan(plan, unpack.ImageLimits.of(cfg))
        if keys:
            unpack.check_keys(image, keys)
        check_download_space(plan, cfg)
        with contextlib.ExitStack() as staged:
            staged.enter_context(store.downloading(plan.top.descriptor.digest, progress.step))
            layout = out or str(staged.enter_context(store.staging(ref)))
            hold = staged.enter_context(store.scratch())  # what the store has: linked
            held = generation.hold_for_pull(plan, store, hold)
            layers = generation.place_for_pull(plan, held, layout)
            progress.step(f"downloading {len(layers)} layers ({len(held)} already here)")
            result = plan.download(layout, layers, progress=progress.transfer("downloaded"))
            if keys and image.encrypted:
                progress.step("decrypting the layers")
                encrypt_layout.decrypt_layout(layout, keys, tag_of(ref))
        layout = out or str(store.layout(ref))  # switched in: the new copy, whole
    tally.add("downloaded", result.bytes_downloaded)
    return PullResult(str(result.reference), layout, image.metadata.container.id,
                      result.downloaded, result.bytes_downloaded, image.encrypted and not keys,
                      signed[0].describe())
