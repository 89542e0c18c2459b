"""A checkpoint's reading of its container's network (torpor.capture.netns over plain netlink)
records what is there: checked here against pyroute2's own reading of the same namespace (an
independent parser of the same kernel answers) and against the sockets /proc lists, in a
namespace of the test's own (`unshare -n sleep`, by pid) with veth links, addresses of both
families, routes in two tables, rules, neighbours and sockets of every kind."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from torpor.capture import netns
from torpor.errors import NetworkError
from torpor.formats.network import Address, Link, Neighbour, NetnsSnapshot, Route, Rule

from .namespaces import own_network_namespace

SETUP = """
ip link set lo up
ip link add d0 type veth peer name d1
ip link set d1 up
ip link set d0 up mtu 1400 address 02:11:22:33:44:55
ip addr add 10.1.2.3/24 dev d0
ip addr add fd00::5/64 dev d0 nodad
ip addr add 192.0.2.7/32 dev lo
ip addr add 10.1.2.4/24 dev d1
ip route add 10.9.0.0/16 via 10.1.2.1 metric 50
ip route add 198.51.100.0/24 dev d0 table 1000
ip route add 203.0.113.0/24 dev d0 src 10.1.2.3
ip -6 route add fd10::/48 via fd00::1 dev d0
ip rule add from 10.1.2.0/24 table 1000 prio 100
ip -6 rule add table 7 prio 5
ip neigh add 10.1.2.9 lladdr 02:aa:bb:cc:dd:ee dev d0 nud permanent
ip -6 neigh add fd00::9 lladdr 02:aa:bb:cc:dd:ef dev d0 nud permanent
ip link add v0 type veth peer name v1
"""

SOCKETS = """
import socket, sys
l4 = socket.socket(); l4.bind(("127.0.0.1", 7070)); l4.listen()
l6 = socket.socket(socket.AF_INET6); l6.bind(("::", 7071)); l6.listen()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("192.0.2.7", 7072))
u6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); u6.bind(("fd00::5", 7073))
c = socket.create_connection(("127.0.0.1", 7070)); s, _ = l4.accept()
m = socket.socket(socket.AF_INET6); m.connect(("::ffff:127.0.0.1", 7070))
b = socket.socket(); b.bind(("192.0.2.7", 7074))   # bound only: not in /proc/net/tcp
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def namespace() -> Iterator[int]:
    """A process in a network namespace of its own, configured by SETUP, and a process there
    holding SOCKETS."""
    if shutil.which("ip") is None:
        pytest.skip("no ip")
    with own_network_namespace(120) as pid:
        enter = ["nsenter", f"--net=/proc/{pid}/ns/net"]
        subprocess.run([*enter, "sh", "-ec", SETUP], check=True, capture_output=True)
        holder = subprocess.Popen([*enter, sys.executable, "-c", SOCKETS], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
            yield pid
        finally:
            holder.kill()
            holder.wait()


def pyroute2_reading(path: str) -> NetnsSnapshot:
    """The same namespace as pyroute2 reads it (what torpor recorded before its own reader)."""
    with netns._ipr(path) as ipr:
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
        addresses = [Address(ifname=names.get(a["index"]), family=netns.FAMILIES[a["family"]],
                             address=a.get("address"), prefixlen=a["prefixlen"],
                             scope=a["scope"]) for a in ipr.get_addr()]
        routes = [Route(family=netns.FAMILIES[family], dst=r.get("dst"), dst_len=r["dst_len"],
                        gateway=r.get("gateway"), oif=names.get(r.get("oif") or 0),
                        prefsrc=r.get("prefsrc"), table=r.get("table"), scope=r["scope"],
                        proto=r["proto"], type=r["type"], priority=r.get("priority"))
                  for family in (socket.AF_INET, socket.AF_INET6)
                  for r in ipr.get_routes(family=family) if r.get("table") != 255]
        rules = [Rule(family=netns.FAMILIES[r["family"]], table=r.get("table"),
                      priority=r.get("priority"), action=r["action"])
                 for family in (socket.AF_INET, socket.AF_INET6)
                 for r in ipr.get_rules(family=family)]
        neighbours = [Neighbour(ifname=names.get(n["ifindex"]), dst=n.get("dst"),
                                lladdr=n.get("lladdr"), state=n["state"])
                      for n in ipr.get_neighbours()]
    return NetnsSnapshot(tuple(links), tuple(addresses), tuple(routes), tuple(rules),
                         tuple(neighbours))


def both_readings(path: str) -> tuple[NetnsSnapshot, NetnsSnapshot]:
    """Ours and pyroute2's, once the namespace holds still around pyroute2's (the kernel adds
    IPv6 multicast neighbours of its own for a while after links come up)."""
    for _ in range(100):
        ours, theirs = netns.snapshot(path), pyroute2_reading(path)
        if netns.snapshot(path) == ours:
            return ours, theirs
        time.sleep(0.05)
    raise AssertionError(f"{path} kept changing")


def test_the_namespace_reads_as_pyroute2_reads_it(namespace: int) -> None:
    path = f"/proc/{namespace}/ns/net"
    ours, theirs = both_readings(path)
    assert ours == theirs
    links = {link.ifname: link for link in ours.links}
    assert links["d0"].mtu == 1400 and links["d0"].address == "02:11:22:33:44:55"
    assert links["d0"].kind == "veth" and links["d0"].state == "up"
    assert links["v0"].state == "down" and links["lo"].kind == "loopback"
    assert {(a.ifname, a.address, a.prefixlen) for a in ours.addresses} >= {
        ("d0", "10.1.2.3", 24), ("d0", "fd00::5", 64), ("lo", "192.0.2.7", 32)}
    routes = {(r.dst, r.dst_len): r for r in ours.routes}
    assert routes[("10.9.0.0", 16)].gateway == "10.1.2.1"
    assert routes[("10.9.0.0", 16)].priority == 50
    assert routes[("198.51.100.0", 24)].table == 1000
    assert routes[("203.0.113.0", 24)].prefsrc == "10.1.2.3"
    assert routes[("fd10::", 48)].gateway == "fd00::1" and routes[("fd10::", 48)].oif == "d0"
    assert all(r.table != 255 for r in ours.routes)
    assert any(r.table == 1000 and r.priority == 100 for r in ours.rules)
    assert any(r.family == "inet6" and r.table == 7 and r.priority == 5 for r in ours.rules)
    assert {(n.dst, n.lladdr) for n in ours.neighbours} >= {
        ("10.1.2.9", "02:aa:bb:cc:dd:ee"), ("fd00::9", "02:aa:bb:cc:dd:ef")}
    assert netns.present_addresses(path) >= {"10.1.2.3", "fd00::5", "192.0.2.7", "127.0.0.1"}


def key(s: Any) -> tuple[str, str, int, str]:
    return (s.proto, s.address, s.port, s.state)


def test_every_socket_is_found_as_proc_lists_it(namespace: int) -> None:
    ours = sorted(netns.socket_addresses(namespace), key=key)
    from_proc = sorted((s for table in ("tcp", "tcp6", "udp", "udp6")
                        for s in netns.proc_sockets(namespace, table)), key=key)
    assert ours == from_proc
    seen = {key(s) for s in ours}
    assert {("tcp", "127.0.0.1", 7070, "listen"), ("tcp", "::", 7071, "listen"),
            ("udp", "192.0.2.7", 7072, "udp"), ("udp", "fd00::5", 7073, "udp")} <= seen
    # both ends of the connection, and the v4-mapped one read as IPv4
    assert sum(1 for s in ours if s.state == "established") == 4
    assert not any(s.port == 7074 for s in ours)
    assert netns.needed_addresses(ours) == ["192.0.2.7", "fd00::5"]


def test_a_dump_longer_than_one_read_is_read_whole(namespace: int) -> None:
    path = f"/proc/{namespace}/ns/net"
    batch = "".join(f"addr add 10.200.{i // 250}.{i % 250 + 1}/32 dev lo\n" for i in range(600))
    subprocess.run(["nsenter", f"--net={path}", "ip", "-batch", "-"], input=batch, text=True,
                   check=True)
    ours, theirs = both_readings(path)
    assert sum(1 for a in ours.addresses if a.address and a.address.startswith("10.200.")) == 600
    assert ours == theirs


def test_a_namespace_that_cannot_be_entered_is_an_error_in_words(tmp_path: Any) -> None:
    with pytest.raises(NetworkError, match=r"cannot enter network namespace .*missing"):
        netns.snapshot(str(tmp_path / "missing"))
    not_a_namespace = tmp_path / "file"
    not_a_namespace.write_text("")
    with pytest.raises(NetworkError, match="cannot enter network namespace"):
        netns.snapshot(str(not_a_namespace))
