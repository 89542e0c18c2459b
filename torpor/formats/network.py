"""A container's network identity as torpor records it (runc gives CRIU `--empty-ns network`,
so CRIU saves the sockets but nothing of the namespace they live in), and the plan a restore
leaves for torpor-hook."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from torpor.errors import FormatError
from torpor.formats.fields import Fields
from torpor.formats.flat import from_flat, to_flat


class _IpFields:
    """Records whose `IP_FIELDS` must hold IP addresses (or nothing): a checkpoint's are read
    from its metadata, and a restore hands them to the kernel."""

    IP_FIELDS: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in self.IP_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            try:
                ipaddress.ip_address(value)
            except ValueError:
                kind = type(self).__name__.lower()
                raise FormatError(f"network {kind}: {name} {str(value)[:80]!r} is not an IP "
                                  "address") from None


@dataclass(frozen=True)
class Link:
    index: int
    ifname: str | None
    kind: str | None
    address: str | None
    mtu: int | None
    state: str | None
    flags: int


@dataclass(frozen=True)
class Address(_IpFields):
    IP_FIELDS = ("address",)
    ifname: str | None
    family: str
    address: str | None
    prefixlen: int
    scope: int


@dataclass(frozen=True)
class Route(_IpFields):
    IP_FIELDS = ("dst", "gateway", "prefsrc")
    family: str
    dst: str | None
    dst_len: int
    gateway: str | None
    oif: str | None
    prefsrc: str | None
    table: int
    scope: int
    proto: int
    type: int
    priority: int | None


@dataclass(frozen=True)
class Rule:
    family: str | None
    table: int | None
    priority: int | None
    action: int


@dataclass(frozen=True)
class Neighbour(_IpFields):
    IP_FIELDS = ("dst",)
    ifname: str | None
    dst: str | None
    lladdr: str | None
    state: int


@dataclass(frozen=True)
class NetnsSnapshot:
    """Links, addresses, routes, rules and neighbours of one network namespace."""

    links: tuple[Link, ...] = ()
    addresses: tuple[Address, ...] = ()
    routes: tuple[Route, ...] = ()
    rules: tuple[Rule, ...] = ()
    neighbours: tuple[Neighbour, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"links": [to_flat(x) for x in self.links],
                "addresses": [to_flat(x) for x in self.addresses],
                "routes": [to_flat(x) for x in self.routes],
                "rules": [to_flat(x) for x in self.rules],
                "neighbours": [to_flat(x) for x in self.neighbours]}

    @classmethod
    def from_json(cls, f: Fields) -> NetnsSnapshot:
        return cls(links=tuple(from_flat(Link, x) for x in f.children("links")),
                   addresses=tuple(from_flat(Address, x) for x in f.children("addresses")),
                   routes=tuple(from_flat(Route, x) for x in f.children("routes")),
                   rules=tuple(from_flat(Rule, x) for x in f.children("rules")),
                   neighbours=tuple(from_flat(Neighbour, x) for x in f.children("neighbours")))


@dataclass(frozen=True)
class SocketAddress(_IpFields):
    """A TCP or UDP socket's local address in the namespace, and its state."""

    IP_FIELDS = ("address",)

    proto: str
    address: str
    port: int
    state: str


@dataclass(frozen=True)
class NetworkState:
    netns_path: str
    created_by_runtime: bool                 # runc made the namespace (not a pod's)
    config: NetnsSnapshot = field(default_factory=NetnsSnapshot)
    sockets: tuple[SocketAddress, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"netns_path": self.netns_path, "created_by_runtime": self.created_by_runtime,
                "config": self.config.to_json(), "sockets": [to_flat(s) for s in self.sockets]}

    @classmethod
    def from_json(cls, f: Fields) -> NetworkState:
        config = f.optional_child("config")
        return cls(netns_path=f.string("netns_path"),
                   created_by_runtime=f.boolean("created_by_runtime"),
                   config=NetnsSnapshot.from_json(config) if config else NetnsSnapshot(),
                   sockets=tuple(from_flat(SocketAddress, s) for s in f.children("sockets")))


@dataclass(frozen=True)
class RestorePlan:
    """What torpor-hook sets up in a namespace CRIU has just created: links to bring up, and
    addresses and routes to add before CRIU binds the sockets again."""

    up: tuple[str, ...] = ("lo",)
    addresses: tuple[Address, ...] = ()
    routes: tuple[Route, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"up": list(self.up), "addresses": [to_flat(a) for a in self.addresses],
                "routes": [to_flat(r) for r in self.routes]}

    @classmethod
    def from_json(cls, f: Fields) -> RestorePlan:
        return cls(up=tuple(f.strings("up")),
                   addresses=tuple(from_flat(Address, a) for a in f.children("addresses")),
                   routes=tuple(from_flat(Route, r) for r in f.children("routes")))
