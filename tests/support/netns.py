"""Network namespaces the tests create (and remove): nodes and container networks, with veths."""

from __future__ import annotations

import os
import subprocess
import uuid


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


class NetNS:
    """A named network namespace, `ip netns add`ed by the test and deleted by it."""

    def __init__(self, prefix: str = "torpor-t") -> None:
        self.name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        ip("netns", "add", self.name)
        ip("link", "set", "lo", "up", netns=self.name)

    @property
    def path(self) -> str:
        return f"/var/run/netns/{self.name}"

    def run(self, *cmd: str, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
        result: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
            ["ip", "netns", "exec", self.name, *cmd], check=check, capture_output=True, text=True,
            **kw)
        return result

    def delete(self) -> None:
        if os.path.exists(self.path):
            ip("netns", "delete", self.name, check=False)


def veth_pair(a: NetNS | None, a_addr: str, b: NetNS, b_addr: str) -> tuple[str, str]:
    """Join two namespaces (None: the test's own) with a veth pair; addresses in CIDR form."""
    tag = uuid.uuid4().hex[:6]
    left, right = f"tv{tag}a", f"tv{tag}b"
    ip("link", "add", left, "type", "veth", "peer", "name", right)
    ip("link", "set", right, "netns", b.name)
    if a is not None:
        ip("link", "set", left, "netns", a.name)
    ip("addr", "add", a_addr, "dev", left, netns=a.name if a else None)
    ip("link", "set", left, "up", netns=a.name if a else None)
    ip("addr", "add", b_addr, "dev", right, netns=b.name)
    ip("link", "set", right, "up", netns=b.name)
    return left, right
