"""Restore on create, the cheap part: which `create` and `start` calls torpor-runc takes over
where `[restore] on_create` is on (main.py asks only then). A `create` whose bundle's
config.json carries a checkpoint's runnable-image mark (one read of that file), and a `start` of a
container restored at create (one stat of a file in runc's state directory of it); every other
call goes to runc as before. Stdlib only; frontend.c makes the same two checks.
"""

from __future__ import annotations

import os

from torpor.shim.argv import Invocation

CHECKPOINT_ENV = "TORPOR_CHECKPOINT"          # = torpor.formats.names.CHECKPOINT_ENV
RESTORED_MARK = "torpor-restored-on-create"   # = torpor.formats.names.RESTORED_ON_CREATE
SPEC_MARK = b'"' + CHECKPOINT_ENV.encode() + b"="
RUNC_ROOT = "/run/runc"                       # runc's default --root


def intercepts(command: str, argv: list[str]) -> bool:
    inv = Invocation(argv)
    if command == "create":
        return spec_marked(inv.flag("bundle", "b") or ".")
    if command == "start":
        mark = restored_mark(inv)
        return mark is not None and os.path.exists(mark)
    return False


def spec_marked(bundle: str) -> bool:
    """Whether the bundle's spec names the mark anywhere (create_cmd then reads it whole)."""
    try:
        with open(os.path.join(bundle, "config.json"), "rb") as f:
            return SPEC_MARK in f.read()
    except OSError:
        return False   # runc says what is wrong with the bundle


def restored_mark(inv: Invocation) -> str | None:
    """The file torpor-runc create leaves in runc's state directory of a container it restored."""
    container_id = inv.container_id
    if not container_id or "/" in container_id or container_id in (".", ".."):
        return None
    return os.path.join(inv.global_flag("root") or RUNC_ROOT, container_id, RESTORED_MARK)
