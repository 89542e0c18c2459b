"""torpor-runc start of a container that torpor-runc create restored: it already runs (CRIU put
its processes back at create), so there is nothing to start; runc would refuse ("cannot start an
already running container") and the shim would report the container failed. The mark create
left goes, so that a second `start` is runc's again. Any other start is runc's."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from torpor.shim import lowlevel
from torpor.shim.on_create_check import restored_mark

if TYPE_CHECKING:
    from torpor.shim.main import Context


def run(ctx: Context) -> int:
    mark = restored_mark(ctx.inv)
    removed = False
    if mark is not None:
        with contextlib.suppress(FileNotFoundError):
            import os

            os.unlink(mark)
            removed = True
    if not removed:
        lowlevel.exec_runtime(ctx.runtime, ctx.inv.argv)
    ctx.log.info(f"{ctx.inv.container_id} was restored at create: it runs already")
    return 0
