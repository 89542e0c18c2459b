"""The version of the CRIU runc runs, remembered under torpor's state directory for as long as
the binary stays the same one (its device, inode, size, mtime and ctime): torpor-runc asks on
every checkpoint whether CRIU takes an option (`network-lock skip`, CRIU 3.19 and later), and
`criu --version` costs a process start each time. Stdlib only."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

from torpor.atomicfile import write_atomic

CACHE = "criu-version.json"
ASK_TIMEOUT_S = 10


def criu_path(given: str | None) -> str | None:
    """The CRIU runc runs: its global --criu, else `criu` on PATH (as runc looks it up)."""
    return shutil.which(given or "criu")


def version(criu: str, state_dir: str) -> tuple[int, ...]:
    """CRIU's version, () where it does not answer."""
    try:
        real = os.path.realpath(criu)
        st = os.stat(real)
    except OSError:
        return ()
    identity = [real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    cache = os.path.join(state_dir, CACHE)
    try:
        with open(cache) as f:
            known = json.load(f)
        if known.get("binary") == identity:
            return tuple(int(part) for part in known["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    found = _ask(real)
    if found:
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
            write_atomic(cache, json.dumps({"binary": identity, "version": found}).encode(),
                         mode=0o600)
        except OSError:
            pass   # asked again next time
    return found


def _ask(criu: str) -> tuple[int, ...]:
    try:
        done = subprocess.run([criu, "--version"], capture_output=True, text=True,
                              timeout=ASK_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return ()
    match = re.search(r"^Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", done.stdout, re.MULTILINE)
    if done.returncode != 0 or match is None:
        return ()
    return tuple(int(part) for part in match.groups() if part is not None)
