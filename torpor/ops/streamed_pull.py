"""A registry pull and the rebuild of CRIU's images in one pass (`torpor restore REF`): the
checkpoint's small state layers first (the chunk index, torpor's state, the volumes), then its
packs and the runnable image's layers, while the images are rebuilt beside the download from
the packs already in place (registry/arrivals.py): the rebuild waits for a pack only when it
needs its first chunk. Every chunk is checked against its digest as it is placed, as in any
rebuild (image/reassemble.py), and every pack against its size and digest as it arrives (the
pull). Either side's failure, or an interrupt, stops the other; the pack download runs without
a clock, as every download does (the registry's own timeouts), the rebuild's `[restore]
timeout_s` runs from the download's end. Encrypted packs are decrypted whole before they are
read, so an image that has them is pulled, then unpacked, as before.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from torpor.capture import deadlines
from torpor.errors import ImageError
from torpor.formats.metadata import CheckpointMetadata
from torpor.image import ocicrypt, unpack
from torpor.image.encryption_keys import DecryptionKey
from torpor.registry.arrivals import Arrivals
from torpor.registry.layout import Layout
from torpor.registry.pull import Layer, PullPlan, PullResult
from torpor.reporting import Progress


def streams(image: unpack.CheckpointImage) -> bool:
    """Whether its CRIU images can be rebuilt as its packs arrive: it has packs, all plain (an
    encrypted one is decrypted whole, then read)."""
    packs = [d for d in image.state_layers if unpack.is_pack(d)]
    return bool(packs) and not any(ocicrypt.is_encrypted(d.media_type) for d in packs)


def download_unpacking(plan: PullPlan, layout: str, layers: list[Layer],
                       image: unpack.CheckpointImage, directory: str,
                       keys: tuple[DecryptionKey, ...], limits: unpack.ImageLimits,
                       metadata: CheckpointMetadata, progress: Progress,
                       limit_s: float) -> int:
    """`layers` into `layout` and the CRIU images into `directory` in one pass; bytes
    downloaded. On failure nothing is left in `directory`; what came stays in the staging
    layout, which the store drops unless it is whole."""
    state = {d.digest for d in image.state_layers if not unpack.is_pack(d)}
    first = [la for la in layers if la.descriptor.digest in state]
    rest = sorted((la for la in layers if la.descriptor.digest not in state),
                  key=lambda la: not unpack.is_pack(la.descriptor))   # the packs first
    _check_room(layout, directory, rest, metadata)
    downloaded = plan.download(layout, first, progress=progress.transfer("downloaded"))
    here = [d.digest for d in image.state_layers
            if unpack.is_pack(d) and Layout(Path(layout)).has_blob(d.digest)]
    arrivals = Arrivals(here)
    outcome: list[PullResult | BaseException] = []
    with deadlines.step_from_arm("unpacking the CRIU images", limit_s,
                                 "[restore] timeout_s") as start_clock:
        def fetch() -> None:
            try:
                outcome.append(plan.download(layout, rest, arrivals=arrivals,
                                             progress=progress.transfer("downloaded")))
                arrivals.finished()
                start_clock()
            except BaseException as e:
                outcome.append(e)
                arrivals.failed(e)

        packs = sum(unpack.is_pack(la.descriptor) for la in rest)
        progress.step(f"rebuilding the CRIU images as their {packs} packs arrive")
        fetcher = threading.Thread(target=fetch, name="torpor-packs", daemon=True)
        fetcher.start()
        try:
            unpack.unpack_state(image, layout, directory, keys=keys, limits=limits,
                                metadata=metadata, arrivals=arrivals)
        except BaseException as e:
            arrivals.cancel(e)
            fetcher.join()
            if outcome and arrivals.first_error is outcome[0]:
                raise outcome[0] from e   # the download failed first: the registry's words
            raise
        fetcher.join()
    [result] = outcome
    if isinstance(result, BaseException):
        shutil.rmtree(directory, ignore_errors=True)
        raise result
    return downloaded.bytes_downloaded + result.bytes_downloaded


def _check_room(layout: str, directory: str, rest: list[Layer],
                metadata: CheckpointMetadata) -> None:
    """The layers still to come and the CRIU images together, before either starts."""
    needed = sum(la.descriptor.size for la in rest) + metadata.sizes.total
    found = os.statvfs(layout)
    free = found.f_bavail * found.f_frsize
    if os.stat(layout).st_dev == os.stat(os.path.dirname(os.path.abspath(directory))).st_dev \
            and needed > free:
        raise ImageError(f"the checkpoint's packs and CRIU images need {needed} bytes; "
                         f"{layout} has {free} free",
                         hint="free space there, or point [image] store elsewhere")
