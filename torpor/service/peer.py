"""Who is on the other end of a connection: SO_PEERCRED, root or the service's own user only."""

from __future__ import annotations

import os

from torpor.handoff import peer_credentials

__all__ = ["peer_credentials", "refusal"]


def refusal(uid: int, own_uid: int | None = None) -> str | None:
    """Why a peer of `uid` may not use the service, None when it may: the service does only
    what root (or its own user) could do."""
    own = os.getuid() if own_uid is None else own_uid
    if uid in (0, own):
        return None
    return (f"torpord runs commands for root only (uid {uid} is not uid 0 or {own}): "
            f"run torpor as root, or with TORPOR_NO_SERVICE=1")
