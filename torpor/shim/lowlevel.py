"""Find the low-level OCI runtime that torpor-runc hands over to, never torpor-runc itself.

The shim launcher `containerd-shim-torpor-v2` puts a directory whose `runc` is torpor-runc first
on PATH, so a plain PATH search would find us again. Every candidate is compared with our own
executable after resolving links, and an environment marker catches a second copy of torpor-runc
installed elsewhere. Stdlib only.
"""

from __future__ import annotations

import os
import sys

# Set in the environment of the low-level runtime; seeing it means runc led back to torpor-runc.
MARKER = "TORPOR_RUNC_LOWLEVEL"
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _self_paths() -> set[str]:
    paths = set()
    for candidate in (sys.argv[0] if sys.argv else "", os.environ.get("_", "")):
        if candidate and os.path.exists(candidate):
            paths.add(os.path.realpath(candidate))
    return paths


def resolve(runtime: str) -> str:
    """Absolute path of the low-level runtime named in the config (`runc` by default)."""
    for directory in _search_dirs(runtime):
        path = os.path.join(directory, runtime)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            if os.path.realpath(path) not in _self_paths() and not os.environ.get(MARKER):
                return path
            break
    return _resolve_slowly(runtime)


def _search_dirs(runtime: str) -> list[str]:
    if "/" in runtime:
        return [os.path.dirname(os.path.abspath(runtime))] if os.path.isabs(runtime) else []
    return [d for d in os.environ.get("PATH", _DEFAULT_PATH).split(":") if d.startswith("/")]


def _resolve_slowly(runtime: str) -> str:
    """The careful search, with a reason for every way it can fail."""
    from torpor.errors import RuntimeNotFound

    if os.environ.get(MARKER):
        raise RuntimeNotFound(
            f"the low-level runtime {os.environ[MARKER]!r} is torpor-runc again",
            hint="set [runtime] path in the torpor config to the real runc binary",
        )
    own = _self_paths()
    if "/" in runtime:
        path = os.path.abspath(runtime)
        if not os.access(path, os.X_OK) or os.path.isdir(path):
            raise RuntimeNotFound(
                f"low-level runtime {path} does not exist or is not executable",
                hint="set [runtime] path in the torpor config (TORPOR_CONFIG or "
                "/etc/torpor/config.toml) to runc's absolute path",
            )
        if os.path.realpath(path) in own:
            raise RuntimeNotFound(f"low-level runtime {path} is torpor-runc itself")
        return path
    for directory in os.environ.get("PATH", _DEFAULT_PATH).split(":"):
        path = os.path.join(directory or ".", runtime)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            if os.path.realpath(path) in own:
                continue
            return os.path.abspath(path)
    raise RuntimeNotFound(
        f"low-level runtime {runtime!r} not found on PATH",
        hint="install runc or set [runtime] path in the torpor config",
    )


def exec_runtime(runtime_path: str, argv: list[str]) -> None:
    """Replace this process with the low-level runtime: fds, signals and exit status are its own."""
    env = dict(os.environ)
    env[MARKER] = runtime_path
    os.execve(runtime_path, [runtime_path, *argv[1:]], env)
