"""Where CRIU would load its own cuda plugin from, so torpor can refuse to run beside it.

torpor drives the CUDA driver itself, around CRIU (lock and checkpoint before the dump, restore
and unlock after the restore). CRIU's cuda_plugin.so does the same from inside CRIU; with both,
the driver gets every call twice. CRIU loads every *.so in one directory: `libdir` from its
configuration files (runc hands it /etc/criu/runc.conf), else $CRIU_LIBS_DIR, else
/usr/lib/criu/ (criu/plugin.c, cr_plugin_init).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

DEFAULT_DIR = "/usr/lib/criu"
CONFIG_FILES = ("/etc/criu/default.conf", "/etc/criu/runc.conf")
PLUGIN = "cuda_plugin.so"


def configured_libdirs(config_files: tuple[str, ...] = CONFIG_FILES) -> list[str]:
    """`libdir DIR` (or `-L DIR`, `--libdir=DIR`) lines of CRIU's configuration files."""
    found = []
    for path in config_files:
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split("#", 1)[0].replace("=", " ").split()
            if len(words) >= 2 and words[0].lstrip("-") in ("libdir", "L"):
                found.append(words[1])
    return found


def plugin_dirs(env: Mapping[str, str] = os.environ,
                config_files: tuple[str, ...] = CONFIG_FILES) -> list[str]:
    dirs = configured_libdirs(config_files)
    dirs.append(env.get("CRIU_LIBS_DIR") or DEFAULT_DIR)
    return dirs


def installed_cuda_plugin(env: Mapping[str, str] = os.environ,
                          config_files: tuple[str, ...] = CONFIG_FILES) -> str | None:
    """The path of a cuda_plugin.so that CRIU would load, or None."""
    for directory in plugin_dirs(env, config_files):
        path = os.path.join(directory, PLUGIN)
        if os.path.exists(path):
            return path
    return None
