"""torpor-runc create (and run): write torpor's hooks into the spec, then hand over to runc."""

from __future__ import annotations

import os

from torpor.errors import ConfigError
from torpor.shim import lowlevel, modifiers, spec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from torpor.shim.main import Context


def spec_modifiers(ctx: Context) -> list[modifiers.SpecModifier]:
    hook = ctx.hook_path()
    if not os.path.isabs(hook) or not os.access(hook, os.X_OK):
        raise ConfigError(
            f"torpor-hook not found at {hook}",
            hint="install torpor-hook beside torpor-runc or set [runtime] hook_path",
        )
    return [modifiers.HookModifier(hook, ctx.cfg.runtime_state_dir)]


def prepare_bundle(ctx: Context) -> str:
    bundle = ctx.inv.flag("bundle", "b") or os.getcwd()
    config = spec.load(bundle)
    if modifiers.apply(config, spec_modifiers(ctx)):
        spec.flush(bundle, config)
    return bundle


def run(ctx: Context) -> int:
    prepare_bundle(ctx)
    lowlevel.exec_runtime(ctx.runtime, ctx.inv.argv)
    return 0  # not reached
