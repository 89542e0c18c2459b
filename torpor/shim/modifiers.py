"""Small, idempotent edits of an OCI spec, applied by torpor-runc before `restore`.

Each modifier changes the spec dict in place and says whether it changed anything; applying one
twice equals applying it once, because a spec restored a second time already carries the edits
of the first (and may come from a node where torpor lives at another path).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from torpor.shim.spec import Spec
else:
    Protocol = object

HOOK_MARKER = "torpor-hook"   # args[0] of every hook torpor writes: how it finds its own entries
HOOK_NAMES = ("createRuntime", "poststop")


class SpecModifier(Protocol):
    def modify(self, spec: Spec) -> bool:
        """Edit `spec` in place; return True when something changed."""
        ...


class HookModifier:
    """Adds torpor-hook to the spec's createRuntime and poststop hooks, replacing older entries,
    and removes every other hook that calls itself torpor's (args[0] torpor-hook), whatever its
    stage or path: torpor's hooks are this node's, never the checkpoint's."""

    def __init__(self, hook_path: str, state_dir: str, names: tuple[str, ...] = HOOK_NAMES):
        self.hook_path = hook_path
        self.state_dir = state_dir
        self.names = names

    def entry(self, name: str) -> dict[str, Any]:
        return {
            "path": self.hook_path,
            "args": [HOOK_MARKER, "--state-dir", self.state_dir, name],
        }

    def modify(self, spec: Spec) -> bool:
        hooks = spec.get("hooks")
        if hooks is None:
            hooks = spec["hooks"] = {}
        changed = False
        for name in [n for n in hooks if n not in self.names]:
            current = hooks.get(name)
            if isinstance(current, list) and any(_is_ours(h) for h in current):
                hooks[name] = [h for h in current if not _is_ours(h)]
                changed = True
        for name in self.names:
            wanted = self.entry(name)
            current = hooks.get(name) or []
            ours = [h for h in current if _is_ours(h)]
            if ours == [wanted]:
                continue
            hooks[name] = [h for h in current if not _is_ours(h)] + [wanted]
            changed = True
        return changed


def _is_ours(hook: Any) -> bool:
    args = hook.get("args") if isinstance(hook, dict) else None
    return isinstance(args, list) and bool(args) and args[0] == HOOK_MARKER


def apply(spec: Spec, modifiers: list[SpecModifier]) -> bool:
    changed = False
    for modifier in modifiers:
        changed = modifier.modify(spec) or changed
    return changed


def torpor_hooks(hook_path: str, state_dir: str) -> list[SpecModifier]:
    """The modifiers a restore applies: torpor-hook at createRuntime (it sets up the restored
    network namespace) and poststop (it removes the container's record directory)."""
    import os

    from torpor.errors import ConfigError

    if not os.path.isabs(hook_path) or not os.access(hook_path, os.X_OK):
        raise ConfigError(f"torpor-hook not found at {hook_path}",
                          hint="install torpor-hook beside torpor-runc or set [runtime] hook_path")
    return [HookModifier(hook_path, state_dir)]
