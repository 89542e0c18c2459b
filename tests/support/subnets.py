"""Networks the tests put in the host's own namespace (a veth's host end, a CNI bridge), one
10.N.0.0/24 each, reserved across every pytest process on the machine: xdist's workers run tests
side by side, and two of them routing one subnet at once send each other's packets to the wrong
container (seen: nerdctl's test reading EOF or timing out on its restored connection while the
other containerd version's run of the same test used the same subnet).

A reservation is an flock on a file named after the subnet, held for as long as the test uses
it: the kernel drops it when the holder ends, however it ends, so nothing stale is left to clean.
Subnets the host already routes are passed over.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass

from .netns import ip

LOCKS = "/run/torpor-tests/subnets"
OCTETS = range(100, 200)  # the Kubernetes tests' pods use 201-203 inside their nodes' namespaces


@dataclass
class Subnet:
    octet: int
    fd: int

    @property
    def net(self) -> str:
        """"10.N.0", to which a host number is added."""
        return f"10.{self.octet}.0"

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _routed() -> set[int]:
    return {int(word.split(".")[1]) for word in ip("-4", "route").stdout.split()
            if word.startswith("10.") and word.count(".") == 3}


def reserve() -> Subnet:
    """A 10.N.0.0/24 no other test holds and the host does not route; release() it after the
    test has removed what it made on it."""
    os.makedirs(LOCKS, mode=0o700, exist_ok=True)
    routed = _routed()
    for octet in OCTETS:
        if octet in routed:
            continue
        fd = os.open(os.path.join(LOCKS, f"10.{octet}"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return Subnet(octet, fd)
    raise AssertionError(f"no free 10.N.0.0/24 among {OCTETS} for a test network")


@contextlib.contextmanager
def reserved(count: int = 1) -> Iterator[list[Subnet]]:
    held: list[Subnet] = []
    try:
        for _ in range(count):
            held.append(reserve())
        yield held
    finally:
        for subnet in held:
            subnet.release()
