"""What this node's runc and CRIU say about themselves, asked once per binary and remembered
under torpor's state directory for as long as the binary stays the same one (its device, inode,
size, mtime and ctime): torpor-runc asks on every checkpoint whether runc takes a flag (`runc
checkpoint --help`) and which CRIU runs (`criu --version`, for `network-lock skip`), and each
question costs a process start. An answer that could not be had is asked again next time.
Stdlib only."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from torpor.atomicfile import write_atomic

CACHE = "tool-answers.json"
ASK_TIMEOUT_S = 10


def criu_path(given: str | None) -> str | None:
    """The CRIU runc runs: its global --criu, else `criu` on PATH (as runc looks it up)."""
    return shutil.which(given or "criu")


def criu_version(criu: str, state_dir: str) -> tuple[int, ...]:
    """CRIU's version, () where it does not answer."""
    found = remembered(criu, "criu --version", state_dir, _ask_criu_version)
    return tuple(found) if isinstance(found, list) else ()


def takes_flag(runtime: str, subcommand: str, flag: str, state_dir: str) -> bool:
    """Whether this runc's `subcommand` has `--flag` (its own --help says)."""
    found = remembered(runtime, f"{subcommand} --help: --{flag}", state_dir,
                       lambda real: _ask_help(real, subcommand, flag))
    return found is True


def remembered(binary: str, question: str, state_dir: str,
               ask: Callable[[str], Any]) -> Any:
    """`ask(binary's real path)`, or what it answered before for this very binary; None (not
    remembered) where it could not say."""
    try:
        real = os.path.realpath(shutil.which(binary) or binary)
        st = os.stat(real)
    except OSError:
        return None
    identity = [real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    cache = os.path.join(state_dir, CACHE)
    known: dict[str, Any] = {}
    try:
        with open(cache) as f:
            loaded = json.load(f)
        known = loaded if isinstance(loaded, dict) else {}
        entry = known.get(question)
        if isinstance(entry, dict) and entry.get("binary") == identity:
            return entry.get("answer")
    except (OSError, ValueError):
        pass
    answer = ask(real)
    if answer is not None:
        known[question] = {"binary": identity, "answer": answer}
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
            write_atomic(cache, json.dumps(known).encode(), mode=0o600)
        except OSError:
            pass   # asked again next time
    return answer


def _run(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=ASK_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None


def _ask_criu_version(criu: str) -> list[int] | None:
    done = _run([criu, "--version"])
    match = re.search(r"^Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", done.stdout, re.MULTILINE) \
        if done is not None and done.returncode == 0 else None
    return [int(part) for part in match.groups() if part is not None] if match else None


def _ask_help(runtime: str, subcommand: str, flag: str) -> bool | None:
    done = _run([runtime, subcommand, "--help"])
    if done is None:
        return None
    return f"--{flag}" in done.stdout + done.stderr
