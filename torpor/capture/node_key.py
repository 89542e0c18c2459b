"""This node's sealing key (`<[image] store>/node.key`): 32 random bytes, 0600, that never leave
the node. torpor-runc seals a checkpoint's spec requests with it (torpor.capture.restore_policy).

The key appears whole or not at all: it is written to a temporary file, fsynced, and then linked
(first key) or renamed (a replacement) into place, and the directory is fsynced. A file of any
other length than 32 bytes is never used as a key: such a file can only be left by a torpor that
wrote the key in place and was killed or lost power meanwhile (an empty key would let anyone
forge "sealed by this node"). It is replaced by a fresh key, the broken file kept beside it as
`node.key.broken`; seals made under the broken key no longer match, so the checkpoints carrying
them meet the restore policy alone, like any checkpoint from elsewhere. Makers and replacers
take a lock (`node.key.lock`), so that two checkpoints racing never end with different keys.

Stdlib only: torpor-runc's checkpoint and restore paths call it.
"""

from __future__ import annotations

import os

from torpor.errors import ConfigError
from torpor.reporting import Log

NODE_KEY = "node.key"
KEY_BYTES = 32


def load(store: str, log: Log | None = None) -> bytes:
    """The node's key in `store`, made the first time it is needed, replaced when broken."""
    path = os.path.join(store, NODE_KEY)
    key = _read(path)
    if key is not None and len(key) == KEY_BYTES:
        return key
    import fcntl

    os.makedirs(store, mode=0o700, exist_ok=True)
    lock = os.open(path + ".lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        key = _read(path)  # another checkpoint may have made or mended it meanwhile
        if key is not None and len(key) == KEY_BYTES:
            return key
        if key is not None:
            os.replace(path, path + ".broken")
            if log is not None:
                log.warning(f"{path} held {len(key)} bytes, not a {KEY_BYTES}-byte key (a write "
                            "cut short); made a new key: checkpoints sealed under the old one "
                            "meet the restore policy alone")
        return _make(path)
    finally:
        os.close(lock)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(KEY_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:  # a directory, no permission: nothing to seal or check with
        raise ConfigError(f"cannot read this node's sealing key {path}: {e.strerror}",
                          hint="it must be a 0600 file of 32 bytes that torpor made; remove "
                          "it to have a new one made (seals made under it will no longer "
                          "match)") from None


def _make(path: str) -> bytes:
    import secrets

    key = secrets.token_bytes(KEY_BYTES)
    tmp = f"{path}.new-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(key)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # appears whole; an existing file is never overwritten
    finally:
        os.unlink(tmp)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return key
