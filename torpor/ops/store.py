"""`torpor ls` and `torpor rm`: the checkpoint images in the local store."""

from __future__ import annotations

from torpor.config import Config
from torpor.image.store import Store, StoreEntry


def ls(cfg: Config) -> list[StoreEntry]:
    """The local images, once checkpoints a crash interrupted are finished (torpor recover)."""
    from torpor.ops import recover

    try:
        recover.recover(cfg)
    except OSError:  # not ours to finish (another user's state dir): list what is there
        pass
    return Store(cfg.image_store).entries()


def rm(cfg: Config, refs: list[str]) -> None:
    store = Store(cfg.image_store)
    for ref in refs:
        store.remove(ref)
