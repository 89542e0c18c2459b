"""Who is on the other end of a connection: SO_PEERCRED, root or the service's own user only."""

from __future__ import annotations

import os
import socket
import struct

_UCRED = struct.Struct("3i")  # pid, uid, gid


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected, as the kernel recorded them."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def refusal(uid: int, own_uid: int | None = None) -> str | None:
    """Why a peer of `uid` may not use the service, None when it may: the service does only
    what root (or its own user) could do."""
    own = os.getuid() if own_uid is None else own_uid
    if uid in (0, own):
        return None
    return (f"torpord runs commands for root only (uid {uid} is not uid 0 or {own}): "
            f"run torpor as root, or with TORPOR_NO_SERVICE=1")
