"""A registry pull and the rebuild of CRIU's images in one pass (`torpor restore REF`): the
checkpoint's small layers first (the metadata, the chunk index, torpor's state, the volumes, the
read-write layer), then its packs, while the images are rebuilt beside the download from the
packs already in place (registry/arrivals.py): the rebuild waits for a pack only when it needs
its first chunk. Every chunk is checked against its digest as it is placed, as in any rebuild
(image/reassemble.py), and every pack against its size and digest as it arrives (the pull).
Encrypted packs are decrypted whole before they are read, so an image that has them is pulled,
then unpacked, as before.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from pathlib import Path

from torpor.formats.metadata import CheckpointMetadata
from torpor.image import ocicrypt, unpack
from torpor.image.encryption_keys import DecryptionKey
from torpor.registry.arrivals import Arrivals
from torpor.registry.layout import Layout
from torpor.registry.pull import Layer, PullPlan, PullResult
from torpor.reporting import Progress


def streams(image: unpack.CheckpointImage) -> bool:
    """Whether its CRIU images can be rebuilt as its packs arrive: plain packs (an encrypted
    one is decrypted whole, then read)."""
    return not any(unpack.is_pack(d) and ocicrypt.is_encrypted(d.media_type)
                   for d in image.state_layers)


def download_unpacking(plan: PullPlan, layout: str, layers: list[Layer],
                       image: unpack.CheckpointImage, directory: str,
                       keys: tuple[DecryptionKey, ...], limits: unpack.ImageLimits,
                       metadata: CheckpointMetadata, progress: Progress,
                       deadline: contextlib.AbstractContextManager[None]) -> int:
    """`layers` into `layout` and the CRIU images into `directory` in one pass: the packs,
    last, arrive while the images are rebuilt from the chunks already in (each chunk checked
    against its digest, each pack's size and digest checked on arrival); bytes downloaded.
    Either fails the other: nothing is left in `directory`, and the packs that came stay with
    the staging layout, which the store drops unless it is whole."""
    first = [la for la in layers if not unpack.is_pack(la.descriptor)]
    packs = [la for la in layers if unpack.is_pack(la.descriptor)]
    downloaded = plan.download(layout, first, progress=progress.transfer("downloaded"))
    here = [d.digest for d in image.state_layers
            if unpack.is_pack(d) and Layout(Path(layout)).has_blob(d.digest)]
    arrivals = Arrivals(here)
    outcome: list[PullResult | BaseException] = []

    def fetch() -> None:
        try:
            outcome.append(plan.download(layout, packs, arrivals=arrivals,
                                         progress=progress.transfer("downloaded")))
        except BaseException as e:
            outcome.append(e)
            arrivals.failed(e)

    progress.step(f"rebuilding the CRIU images as {len(packs)} packs arrive")
    fetcher = threading.Thread(target=fetch, name="torpor-packs", daemon=True)
    fetcher.start()
    try:
        with deadline:
            unpack.unpack_state(image, layout, directory, keys=keys, limits=limits,
                                metadata=metadata, arrivals=arrivals)
    except BaseException:
        arrivals.stopped.set()
        fetcher.join()
        raise
    fetcher.join()
    [result] = outcome
    if isinstance(result, BaseException):
        shutil.rmtree(directory, ignore_errors=True)
        raise result
    return downloaded.bytes_downloaded + result.bytes_downloaded

