"""Setting up a restored container's new network namespace, from torpor-hook at CRIU's
setup-namespaces step, before CRIU binds sockets again.

Almost every plan is "bring lo up" (the kernel gives lo 127.0.0.1/8 and ::1 as it comes up),
and that runs inside CRIU's restore. The compiled torpor-hook (torpor/shim/frontend.c) does that
plan itself, without starting Python; here, where it could not (no C compiler at install, an
OCI state it does not read plainly), it is done with the standard library: setns(2) into the
restored init's namespace and one RTM_NEWLINK over rtnetlink. Plans with more (addresses on
lo, routes) go to torpor.capture.netns, which uses pyroute2.
"""

from __future__ import annotations

import os
import socket

from torpor import fastjson
from torpor.capture import netlink

RTM_NEWLINK = 16
IFF_UP = 0x1
LOOPBACK_INDEX = 1


def _link_up(index: int) -> None:
    """rtnetlink: set IFF_UP on the link with this index, and wait for the kernel's answer."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        netlink.ask(sock, RTM_NEWLINK, netlink.IFINFO.pack(socket.AF_UNSPEC, 0, index, IFF_UP, IFF_UP),
                    "RTM_NEWLINK lo up")


def apply(plan_path: str, pid: int) -> None:
    """Apply the plan torpor-runc restore left, in pid's network namespace; then remove it."""
    try:
        with open(plan_path, "rb") as f:
            plan = fastjson.loads(f.read())
        if plan.get("addresses") or plan.get("routes") or set(plan.get("up", [])) - {"lo"}:
            from torpor.capture.netns import apply_restore_plan

            apply_restore_plan(plan, pid)
            return
        if "lo" in plan.get("up", []):
            netlink.setns(f"/proc/{pid}/ns/net")
            _link_up(LOOPBACK_INDEX)
    finally:
        try:
            os.unlink(plan_path)
        except OSError:
            pass
