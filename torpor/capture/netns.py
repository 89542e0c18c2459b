"""A container's network identity: capture it with pyroute2, check it, set it up again.

runc always gives CRIU `--empty-ns network`, so CRIU saves sockets but nothing of the namespace
they live in. torpor records links (kind, MAC, MTU, state), addresses, routes, rules and
neighbours before the dump, plus the local addresses its sockets are bound to. On restore into a
new namespace (runc made it), the hook brings up lo and puts back the addresses and routes of the
links that exist there before CRIU binds sockets again; into an existing namespace (a path, as
in a pod), the addresses the sockets need are checked, and added only when asked to.
pyroute2's errors become NetworkError here.
"""

from __future__ import annotations

import importlib
import importlib.util
import ipaddress
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from torpor.errors import NetworkError
from torpor.formats.network import (
    Address,
    Link,
    Neighbour,
    NetnsSnapshot,
    NetworkState,
    RestorePlan,
    Route,
    Rule,
    SocketAddress,
)
from torpor.formats.oci import OciSpec

FAMILIES = {socket.AF_INET: "inet", socket.AF_INET6: "inet6"}
TCP_STATES = {"01": "established", "02": "syn-sent", "03": "syn-recv", "04": "fin-wait1",
              "05": "fin-wait2", "06": "time-wait", "07": "close", "08": "close-wait",
              "09": "last-ack", "0A": "listen", "0B": "closing"}


def _ipr(netns: str) -> Any:
    """An IPRoute whose netlink socket lives in the namespace at `netns`.

    pyroute2's own `IPRoute(netns=...)` forks a child to enter the namespace (150-450 ms here);
    instead this thread enters it (setns on a descriptor opened read-only: never creating a
    namespace, as pyroute2's O_CREAT default would), opens the socket there, and comes back to
    its own namespace. The socket stays bound to the namespace it was made in."""
    _defer_pyroute2_package()
    from pyroute2.iproute.linux import IPRoute
    from pyroute2.netns import setns

    try:
        target = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise NetworkError(f"cannot enter network namespace {netns}: {e.strerror}") from None
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(target)
        try:
            return IPRoute()
        finally:
            setns(own)
    except OSError as e:
        raise NetworkError(f"cannot enter network namespace {netns}: {e.strerror or e}") from None
    finally:
        os.close(target)
        os.close(own)


def preload() -> None:
    """Import what `_ipr` needs now (torpord, before it forks its children)."""
    _defer_pyroute2_package()
    importlib.import_module("pyroute2.iproute.linux")
    importlib.import_module("pyroute2.netns")


def _defer_pyroute2_package() -> None:
    """pyroute2's package `__init__` imports every module it has (IPDB, NDB, conntrack, ipset,
    ...), about 50 ms more than the few that IPRoute needs, on every checkpoint and restore.
    When nothing has imported pyroute2 yet, its package is registered without running that
    `__init__`; the first attribute asked of the package itself (`from pyroute2 import NDB`)
    runs it then, so other code in the process sees the whole package as usual."""
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.loader is None:
        return  # not installed: the import below says so
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def complete(name: str) -> Any:
        if importlib.util.find_spec(f"pyroute2.{name}") is not None:  # a module: just it
            return importlib.import_module(f"pyroute2.{name}")
        delattr(package, "__getattr__")
        loader.exec_module(package)
        return getattr(package, name)

    vars(package)["__getattr__"] = complete  # PEP 562: asked for what it lacks
    sys.modules["pyroute2"] = package


def _links(ipr: Any) -> tuple[list[Link], dict[int, str]]:
    links, names = [], {}
    for msg in ipr.get_links():
        index, name = msg["index"], msg.get("ifname")
        names[index] = name
        links.append(Link(
            index=index, ifname=name,
            kind=msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") or (
                "loopback" if name == "lo" else None),
            address=msg.get("address"), mtu=msg.get("mtu"), state=msg.get("state"),
            flags=msg["flags"]))
    return links, names


def snapshot(netns: str) -> NetnsSnapshot:
    """Links, addresses, routes, rules and neighbours of the namespace at `netns`."""
    try:
        with _ipr(netns) as ipr:
            links, names = _links(ipr)
            addresses = [Address(
                ifname=names.get(a["index"]), family=FAMILIES.get(a["family"], str(a["family"])),
                address=a.get("address"), prefixlen=a["prefixlen"], scope=a["scope"],
            ) for a in ipr.get_addr()]
            routes = []
            for family in (socket.AF_INET, socket.AF_INET6):
                for r in ipr.get_routes(family=family):
                    table = r.get("table") or r["table"]
                    if table == 255:  # the kernel's local table follows the addresses
                        continue
                    routes.append(Route(
                        family=FAMILIES[family], dst=r.get("dst"), dst_len=r["dst_len"],
                        gateway=r.get("gateway"), oif=names.get(r.get("oif") or 0),
                        prefsrc=r.get("prefsrc"), table=table, scope=r["scope"],
                        proto=r["proto"], type=r["type"], priority=r.get("priority")))
            rules = [Rule(family=FAMILIES.get(r["family"]), table=r.get("table"),
                          priority=r.get("priority"), action=r["action"])
                     for family in (socket.AF_INET, socket.AF_INET6)
                     for r in ipr.get_rules(family=family)]
            neighbours = [Neighbour(ifname=names.get(n["ifindex"]), dst=n.get("dst"),
                                    lladdr=n.get("lladdr"), state=n["state"])
                          for n in ipr.get_neighbours()]
    except NetworkError:
        raise
    except Exception as e:
        raise NetworkError(f"cannot read network namespace {netns}: {e}") from None
    return NetnsSnapshot(tuple(links), tuple(addresses), tuple(routes), tuple(rules),
                         tuple(neighbours))


def _hex_address(text: str) -> str:
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    address = ipaddress.IPv6Address(words)
    return str(address.ipv4_mapped or address)


def socket_addresses(pid: int) -> tuple[SocketAddress, ...]:
    """TCP and UDP sockets in pid's network namespace: local address, port and state."""
    sockets = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/{pid}/net/{proto}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            host, port = local.split(":")
            sockets.append(SocketAddress(
                proto=proto.rstrip("6"), address=_hex_address(host), port=int(port, 16),
                state=TCP_STATES.get(state, state) if proto.startswith("tcp") else "udp"))
    return tuple(sockets)


def needed_addresses(sockets: Sequence[SocketAddress]) -> list[str]:
    """The specific local addresses sockets are bound to (wildcards need none)."""
    wanted = set()
    for s in sockets:
        address = ipaddress.ip_address(s.address)
        if not address.is_unspecified and not address.is_loopback:
            wanted.add(str(address))
    return sorted(wanted)


def present_addresses(netns: str) -> set[str]:
    try:
        with _ipr(netns) as ipr:
            return {a.get("address") for a in ipr.get_addr()}
    except NetworkError:
        raise
    except Exception as e:
        raise NetworkError(f"cannot read addresses in {netns}: {e}") from None


def missing_addresses(netns: str, needed: list[str]) -> list[str]:
    present = present_addresses(netns)
    return [a for a in needed if a not in present]


def add_addresses(netns: str, wanted: list[str], recorded: NetnsSnapshot) -> None:
    """Add `wanted` addresses, with their recorded prefixes, on the links they had (by name),
    or on lo."""
    by_address = {a.address: a for a in recorded.addresses}
    try:
        with _ipr(netns) as ipr:
            indexes = {link.get("ifname"): link["index"] for link in ipr.get_links()}
            for address in wanted:
                entry = by_address.get(address)
                # the recorded prefix brings its subnet route, so sockets reach their peers
                index = (indexes.get(entry.ifname) if entry else None) or indexes["lo"]
                prefix = (entry.prefixlen if entry else 0) or (32 if ":" not in address else 128)
                ipr.addr("add", index=index, address=address, prefixlen=prefix)
    except Exception as e:
        raise NetworkError(f"cannot add addresses {', '.join(wanted)} in {netns}: {e}") from None


KERNEL_LO_ADDRESSES = {("127.0.0.1", 8), ("::1", 128)}


def restore_plan(recorded: NetnsSnapshot, extra: Sequence[str] = ()) -> RestorePlan:
    """What the hook sets up in a namespace CRIU has just created (only lo exists there). The
    kernel gives lo its usual addresses as it comes up, so only others are listed; `extra`
    addresses (the sockets need them) go on lo."""
    addresses = [a for a in recorded.addresses if a.ifname == "lo"
                 and (a.address, a.prefixlen) not in KERNEL_LO_ADDRESSES]
    for address in extra:
        v6 = ":" in address
        addresses.append(Address(ifname="lo", family="inet6" if v6 else "inet", address=address,
                                 prefixlen=128 if v6 else 32, scope=0))
    routes = [r for r in recorded.routes if r.oif == "lo"]
    return RestorePlan(("lo",), tuple(addresses), tuple(routes))


def write_restore_plan(path: str, plan: RestorePlan) -> None:
    import json

    from torpor.atomicfile import write_atomic

    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_atomic(path, json.dumps(plan.to_json()).encode(), mode=0o600)


def apply_restore_plan(plan: RestorePlan, pid: int) -> None:
    """Run by torpor-hook createRuntime during a restore, in the restored init's namespace,
    for plans beyond bringing lo up (see torpor.oci_hooks.netplan)."""
    netns = f"/proc/{pid}/ns/net"
    try:
        with _ipr(netns) as ipr:
            indexes = {link.get("ifname"): link["index"] for link in ipr.get_links()}
            for name in plan.up:
                if name in indexes:
                    ipr.link("set", index=indexes[name], state="up")
            for a in plan.addresses:
                index = indexes.get(a.ifname)
                if index is None:
                    continue
                try:
                    ipr.addr("add", index=index, address=a.address, prefixlen=a.prefixlen)
                except Exception as e:
                    if "exists" not in str(e).lower():
                        raise
            for r in plan.routes:
                index = indexes.get(r.oif)
                if index is None or not r.dst:
                    continue
                try:
                    ipr.route("add", dst=f"{r.dst}/{r.dst_len}", oif=index,
                              table=r.table or 254, scope=r.scope)
                except Exception as e:
                    if "exists" not in str(e).lower():
                        raise
    except Exception as e:
        raise NetworkError(f"cannot set up the restored network namespace of pid {pid}: {e}") from None


def shares_host_network(spec: OciSpec) -> bool:
    """The spec names no network namespace: the container runs in the host's."""
    return not any(ns.get("type") == "network"
                   for ns in (spec.get("linux") or {}).get("namespaces") or [])


def spec_netns_path(spec: OciSpec) -> str | None:
    """The network namespace path the spec names (a pod's), or None when runc makes one."""
    for ns in (spec.get("linux") or {}).get("namespaces") or []:
        if ns.get("type") == "network":
            return str(ns.get("path") or "") or None
    return None


def capture(spec: OciSpec, pid: int) -> NetworkState:
    """The container's network: its namespace's configuration and its sockets' addresses."""
    explicit = spec_netns_path(spec)
    return NetworkState(netns_path=explicit or f"/proc/{pid}/ns/net",
                        created_by_runtime=explicit is None,
                        config=snapshot(f"/proc/{pid}/ns/net"),
                        sockets=socket_addresses(pid))
