"""A process in a network namespace of its own (`unshare -n sleep`, by pid), for the unit tests
that read or set up a namespace the way torpor does inside a container's."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def own_network_namespace(lifetime_s: int = 60) -> Iterator[int]:
    """The pid of a process alone in a new network namespace (its lo down), once unshare(2)
    is done; killed and reaped after."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    proc = subprocess.Popen(["unshare", "-n", "sleep", str(lifetime_s)])
    try:
        own = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{proc.pid}/ns/net") == own:   # until unshare(2) is done
            assert time.monotonic() < deadline, "unshare -n did not make its namespace"
            time.sleep(0.005)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
