"""`torpor ls` and `torpor rm`: the checkpoint images in the local store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torpor.config import Config
from torpor.errors import NotFound
from torpor.formats import annotations as ann
from torpor.image.store import Store, StoreEntry

if TYPE_CHECKING:
    from torpor.containerd.client import Client


def ls(cfg: Config) -> list[StoreEntry]:
    """The local images, once checkpoints a crash interrupted are finished (torpor recover)."""
    from torpor.ops import recover

    try:
        recover.recover(cfg)
    except OSError:  # not ours to finish (another user's state dir): list what is there
        pass
    return Store(cfg.image_store).entries()


def rm(cfg: Config, refs: list[str], client: Client | None = None) -> list[str]:
    """Remove each image from the store, and from containerd (`client`'s namespace) the
    runnable image a restore imported under that name (labelled as torpor's: an image of the
    same name that torpor did not make stays). The names removed from containerd."""
    store = Store(cfg.image_store)
    for ref in refs:
        store.remove(ref)
    return [ref for ref in refs if client is not None and _forget_image(client, ref)]


def _forget_image(client: Client, name: str) -> bool:
    try:
        image = client.get_image(name)
    except NotFound:
        return False
    if ann.IMAGE_CHECKPOINT not in image.labels:
        return False
    client.delete_image(name)   # a container made from it keeps its snapshot
    return True


def has(cfg: Config, ref: str) -> bool:
    return Store(cfg.image_store).has(ref)
