"""tests/unit keeps its temporary files in memory.

The unit suite writes some 800 MiB of test inputs and packs under tmp_path. On a disk (this
project's CI VM) that writing alone took 1.3-1.4 s of the suite's 9 s, close to its 10 s
budget; on tmpfs it costs a copy. So when nobody chose --basetemp and /dev/shm is a writable
tmpfs, the session's temporary directory is a fresh one there, removed when the session ends.
The tests do not depend on the filesystem: they pass on either.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

SHM = "/dev/shm"
MADE = pytest.StashKey[str]()   # the directory this session made, to remove


def in_memory() -> bool:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            tmpfs = any(line.split()[1:3] == [SHM, "tmpfs"] for line in mounts)
    except OSError:
        return False
    return tmpfs and os.access(SHM, os.W_OK | os.X_OK)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Before pytest's own tmp_path factory reads the option; xdist's workers are given a
    directory under the controller's, so only the controller makes one."""
    if config.option.basetemp or hasattr(config, "workerinput") or not in_memory():
        return
    config.option.basetemp = tempfile.mkdtemp(prefix="torpor-unit-", dir=SHM)
    config.stash[MADE] = config.option.basetemp


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(MADE, None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)

