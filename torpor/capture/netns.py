"""A container's network identity: capture it, check it, set it up again.

runc always gives CRIU `--empty-ns network`, so CRIU saves sockets but nothing of the namespace
they live in. torpor records links (kind, MAC, MTU, state), addresses, routes, rules and
neighbours before the dump, plus the local addresses its sockets are bound to. On restore into a
new namespace (runc made it), the hook brings up lo and puts back the addresses and routes of the
links that exist there before CRIU binds sockets again; into an existing namespace (a path, as
in a pod), the addresses the sockets need are checked, and added only when asked to.
Reading is plain netlink (torpor.capture.netlink); the writes are pyroute2's, whose errors
become NetworkError here.
"""

from __future__ import annotations

import importlib
import importlib.util
import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from torpor.capture import netlink
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
    instead this thread enters it (netlink.entered: never creating a namespace, as pyroute2's
    O_CREAT default would), opens the socket there, and comes back to its own namespace."""
    _defer_pyroute2_package()
    from pyroute2.iproute.linux import IPRoute

    try:
        with netlink.entered(netns):
            return IPRoute()
    except OSError as e:
        raise NetworkError(f"cannot enter network namespace {netns}: {e.strerror or e}") from None


def preload() -> None:
    """Import what `_ipr` needs now (torpord, before it forks its children)."""
    _defer_pyroute2_package()
    importlib.import_module("pyroute2.iproute.linux")


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


RTM_GETLINK, RTM_GETADDR, RTM_GETROUTE, RTM_GETNEIGH, RTM_GETRULE = 18, 22, 26, 30, 34
SOCK_DIAG_BY_FAMILY = 20
IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg and fib_rule_hdr: family, dst_len, src_len, tos,
#                                      table, protocol (rules: 2 reserved), scope, type (action)
NDMSG = struct.Struct("=BxxxiHBB")  # ndmsg: family, ifindex, state, flags, type
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO, IFLA_INFO_KIND = 1, 3, 4, 18, 1
IFA_ADDRESS = 1
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_TABLE = 1, 4, 5, 6, 7, 15
FRA_PRIORITY, FRA_TABLE = 6, 15
NDA_DST, NDA_LLADDR = 1, 2
IFF_UP = 0x1
U32 = struct.Struct("=I")
# inet_diag_req_v2 (family, protocol, extensions, pad, states, an empty socket id) and the
# inet_diag_msg answer: family, state, then the id (source port at 4, big-endian; source
# address at 8)
DIAG_REQUEST = struct.Struct("=BBBBI48x")
ALL_STATES = 0xFFFFFFFF
# a TCP socket bound but neither listening nor connected (TCP_CLOSE, and the kernel's
# TCP_BOUND_INACTIVE pseudo-state since 6.6 that selects them): /proc/net/tcp leaves it out
TCP_UNLISTED = (1 << 7) | (1 << 13)
SOCKET_TABLES = (("tcp", socket.AF_INET, socket.IPPROTO_TCP),
                 ("tcp6", socket.AF_INET6, socket.IPPROTO_TCP),
                 ("udp", socket.AF_INET, socket.IPPROTO_UDP),
                 ("udp6", socket.AF_INET6, socket.IPPROTO_UDP))


def _ip(family: int, raw: bytes | None) -> str | None:
    if raw is None or family not in FAMILIES:
        return None
    return socket.inet_ntop(family, raw)


def _u32(raw: bytes | None) -> int | None:
    return U32.unpack_from(raw)[0] if raw is not None and len(raw) >= 4 else None


def _text(raw: bytes | None) -> str | None:
    return raw.split(b"\0", 1)[0].decode(errors="replace") if raw is not None else None


def _lladdr(raw: bytes | None) -> str | None:
    return ":".join(f"{b:02x}" for b in raw) if raw is not None else None


def _links(sock: socket.socket) -> tuple[list[Link], dict[int, str | None]]:
    links, names = [], {}
    for msg in netlink.dump(sock, RTM_GETLINK, netlink.IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        _family, _type, index, flags, _change = netlink.IFINFO.unpack_from(msg)
        attrs = netlink.attributes(msg, netlink.IFINFO.size)
        name = _text(attrs.get(IFLA_IFNAME))
        info = attrs.get(IFLA_LINKINFO)
        kind = _text(netlink.attributes(info, 0).get(IFLA_INFO_KIND)) if info else None
        names[index] = name
        links.append(Link(index=index, ifname=name,
                          kind=kind or ("loopback" if name == "lo" else None),
                          address=_lladdr(attrs.get(IFLA_ADDRESS)), mtu=_u32(attrs.get(IFLA_MTU)),
                          state="up" if flags & IFF_UP else "down", flags=flags))
    return links, names


def _addresses(sock: socket.socket, names: dict[int, str | None]) -> list[Address]:
    addresses = []
    for msg in netlink.dump(sock, RTM_GETADDR, IFADDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        family, prefixlen, _flags, scope, index = IFADDR.unpack_from(msg)
        attrs = netlink.attributes(msg, IFADDR.size)
        addresses.append(Address(ifname=names.get(index),
                                 family=FAMILIES.get(family, str(family)),
                                 address=_ip(family, attrs.get(IFA_ADDRESS)),
                                 prefixlen=prefixlen, scope=scope))
    return addresses


def _by_family(sock: socket.socket, kind: int) -> Iterator[tuple[socket.AddressFamily, bytes]]:
    """A dump of `kind` (routes, rules: an rtmsg-shaped header) for IPv4, then IPv6; only the
    answers of the family asked (a kernel without the family answers with every family's)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        for msg in netlink.dump(sock, kind, RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)):
            if msg[0] == family:
                yield family, msg


def _routes(sock: socket.socket, names: dict[int, str | None]) -> list[Route]:
    routes = []
    for family, msg in _by_family(sock, RTM_GETROUTE):
        _f, dst_len, _src_len, _tos, table, proto, scope, kind, _flags = RTMSG.unpack_from(msg)
        attrs = netlink.attributes(msg, RTMSG.size)
        table = _u32(attrs.get(RTA_TABLE)) or table
        if table == 255:  # the kernel's local table follows the addresses
            continue
        routes.append(Route(
            family=FAMILIES[family], dst=_ip(family, attrs.get(RTA_DST)), dst_len=dst_len,
            gateway=_ip(family, attrs.get(RTA_GATEWAY)),
            oif=names.get(_u32(attrs.get(RTA_OIF)) or 0),
            prefsrc=_ip(family, attrs.get(RTA_PREFSRC)), table=table, scope=scope,
            proto=proto, type=kind, priority=_u32(attrs.get(RTA_PRIORITY))))
    return routes


def _rules(sock: socket.socket) -> list[Rule]:
    rules = []
    for family, msg in _by_family(sock, RTM_GETRULE):
        *_head, table, _r1, _r2, action, _flags = RTMSG.unpack_from(msg)
        attrs = netlink.attributes(msg, RTMSG.size)
        from_attr = _u32(attrs.get(FRA_TABLE))
        rules.append(Rule(family=FAMILIES.get(family),
                          table=from_attr if from_attr is not None else table,
                          priority=_u32(attrs.get(FRA_PRIORITY)), action=action))
    return rules


def _neighbours(sock: socket.socket, names: dict[int, str | None]) -> list[Neighbour]:
    neighbours = []
    for msg in netlink.dump(sock, RTM_GETNEIGH, NDMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        family, index, state, _flags, _type = NDMSG.unpack_from(msg)
        attrs = netlink.attributes(msg, NDMSG.size)
        neighbours.append(Neighbour(ifname=names.get(index), dst=_ip(family, attrs.get(NDA_DST)),
                                    lladdr=_lladdr(attrs.get(NDA_LLADDR)), state=state))
    return neighbours


def snapshot(netns: str) -> NetnsSnapshot:
    """Links, addresses, routes, rules and neighbours of the namespace at `netns`."""
    try:
        with _netlink(netns, socket.NETLINK_ROUTE) as sock:
            links, names = _links(sock)
            addresses = _addresses(sock, names)
            routes = _routes(sock, names)
            rules = _rules(sock)
            neighbours = _neighbours(sock, names)
    except (OSError, struct.error, ValueError) as e:
        raise NetworkError(f"cannot read network namespace {netns}: {e}") from None
    return NetnsSnapshot(tuple(links), tuple(addresses), tuple(routes), tuple(rules),
                         tuple(neighbours))


def _netlink(netns: str, protocol: int) -> socket.socket:
    try:
        return netlink.socket_in(netns, protocol)
    except OSError as e:
        raise NetworkError(f"cannot enter network namespace {netns}: {e.strerror or e}") from None


def _hex_address(text: str) -> str:
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return _socket_ip(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return _socket_ip(socket.AF_INET6, words)


def _socket_ip(family: int, raw: bytes) -> str:
    if family == socket.AF_INET:
        return str(ipaddress.IPv4Address(raw[:4]))
    address = ipaddress.IPv6Address(raw[:16])
    return str(address.ipv4_mapped or address)


def socket_addresses(pid: int) -> tuple[SocketAddress, ...]:
    """TCP and UDP sockets in pid's network namespace: local address, port and state, as
    /proc/PID/net lists them (a TCP socket bound but neither listening nor connected is not
    there). Asked of sock_diag; a table it does not serve (its kernel module missing) or
    answers oddly is read from /proc."""
    netns = f"/proc/{pid}/ns/net"
    try:
        sock = _netlink(netns, netlink.NETLINK_SOCK_DIAG)
    except NetworkError:
        return tuple(s for table, _, _ in SOCKET_TABLES for s in proc_sockets(pid, table))
    sockets: list[SocketAddress] = []
    with sock:
        for table, family, protocol in SOCKET_TABLES:
            states = ALL_STATES & ~TCP_UNLISTED if protocol == socket.IPPROTO_TCP else ALL_STATES
            try:
                found = [_socket(table, _socket_ip(msg[0], msg[8:24]),
                                 struct.unpack_from(">H", msg, 4)[0], f"{msg[1]:02X}")
                         for msg in netlink.dump(sock, SOCK_DIAG_BY_FAMILY,
                                                 DIAG_REQUEST.pack(family, protocol, 0, 0, states))]
            except (OSError, struct.error, ValueError, IndexError):
                found = proc_sockets(pid, table)
            sockets += found
    return tuple(sockets)


def proc_sockets(pid: int, table: str) -> list[SocketAddress]:
    """One of /proc/PID/net/{tcp,tcp6,udp,udp6}, where sock_diag cannot answer."""
    try:
        with open(f"/proc/{pid}/net/{table}") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return []
    sockets = []
    for line in lines:
        fields = line.split()
        host, port = fields[1].split(":")
        sockets.append(_socket(table, _hex_address(host), int(port, 16), fields[3]))
    return sockets


def _socket(table: str, address: str, port: int, state: str) -> SocketAddress:
    return SocketAddress(proto=table.rstrip("6"), address=address, port=port,
                         state=TCP_STATES.get(state, state) if table.startswith("tcp") else "udp")


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
        with _netlink(netns, socket.NETLINK_ROUTE) as sock:
            return {a.address for a in _addresses(sock, {}) if a.address}
    except (OSError, struct.error, ValueError) as e:
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
    except netlink.NamespaceStuck:
        raise
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
    except netlink.NamespaceStuck:
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
