"""What this node's runc and CRIU say about themselves, asked once per binary and remembered
under torpor's state directory for as long as the binary stays the same one (its device, inode,
size, mtime and ctime): torpor-runc asks on every checkpoint whether runc takes a flag (`runc
checkpoint --help`) and which CRIU runs (`criu --version`, for `network-lock skip`), and each
question costs a process start. An answer that could not be had is asked again next time. The
identity is the file's own: a wrapper script whose target changes keeps its old answers until
the script itself changes (or the state directory, a tmpfs, goes with a reboot). Stdlib only."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable
from typing import Any

from torpor.atomicfile import write_atomic

CACHE = "tool-answers.json"
MAX_CACHE = 1 << 16
ASK_TIMEOUT_S = 10


def criu_path(given: str | None) -> str | None:
    """The CRIU runc runs: its global --criu, else `criu` on PATH (as runc looks it up)."""
    return shutil.which(given or "criu")


def criu_version(criu: str, state_dir: str) -> tuple[int, ...]:
    """CRIU's version, () where it does not answer."""
    found = remembered(criu, "criu --version", state_dir, _ask_criu_version, _is_version)
    return tuple(found) if _is_version(found) else ()


def takes_flag(runtime: str, subcommand: str, flag: str, state_dir: str) -> bool:
    """Whether this runc's `subcommand` has `--flag` (its own --help says)."""
    found = remembered(runtime, f"{subcommand} --help: --{flag}", state_dir,
                       lambda real: _ask_help(real, subcommand, flag),
                       lambda answer: isinstance(answer, bool))
    return found is True


def remembered(binary: str, question: str, state_dir: str, ask: Callable[[str], Any],
               valid: Callable[[Any], bool]) -> Any:
    """`ask(binary's real path)`, or what it answered before for this very binary; None (not
    remembered) where it could not say. The file is trusted only where it is root's own (this
    process's user's) and nobody else may write it; else every question is asked again."""
    located = binary if os.path.isabs(binary) else shutil.which(binary)
    if not located:
        return None
    try:
        real = os.path.realpath(located)
        st = os.stat(real)
    except OSError:
        return None
    identity = [real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    cache = os.path.join(state_dir, CACHE)
    known, trusted = _load(cache)
    entry = known.get(question)
    if isinstance(entry, dict) and entry.get("binary") == identity and valid(entry.get("answer")):
        return entry["answer"]
    answer = ask(real)
    if answer is not None and trusted:
        known[question] = {"binary": identity, "answer": answer}
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
            write_atomic(cache, json.dumps(known).encode(), mode=0o600, durable=False)
        except OSError:
            pass   # asked again next time
    return answer


def _load(cache: str) -> tuple[dict[str, Any], bool]:
    """The remembered answers, and whether the file may be used at all (absent: yes)."""
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}, _safe_directory(os.path.dirname(cache))
    except OSError:
        return {}, False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022 \
                or st.st_size > MAX_CACHE or not _safe_directory(os.path.dirname(cache)):
            return {}, False
        loaded = json.loads(os.read(fd, MAX_CACHE))
    except (OSError, ValueError, RecursionError):
        return {}, True   # damaged: asked again, and written anew
    finally:
        os.close(fd)
    return (loaded if isinstance(loaded, dict) else {}), True


def _safe_directory(path: str) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return True   # made by us, 0700
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _is_version(answer: Any) -> bool:
    return isinstance(answer, list) and 2 <= len(answer) <= 4 and \
        all(isinstance(part, int) and not isinstance(part, bool) and part >= 0 for part in answer)


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
    """None (not remembered) unless runc answered as runc does: status 0, its usage line."""
    done = _run([runtime, subcommand, "--help"])
    if done is None or done.returncode != 0:
        return None
    text = done.stdout + done.stderr
    if f"runc {subcommand}" not in text and "USAGE" not in text.upper():
        return None
    return f"--{flag}" in text
