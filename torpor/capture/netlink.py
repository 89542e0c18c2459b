"""Netlink with the standard library: a socket in another network namespace, dumps, attributes.

A checkpoint reads its container's network every time (torpor.capture.netns): links,
addresses, routes, rules and neighbours over rtnetlink, and the sockets' local addresses over
sock_diag. Reading the sockets from /proc/PID/net/tcp walks the kernel's whole connection table
(~9 ms here for the four tables of an empty namespace, against ~2 ms by sock_diag), and
pyroute2's import and parsing cost more than the few messages need. Writes (a restore's
addresses and routes) stay with pyroute2.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

CLONE_NEWNET = 0x40000000
NETLINK_SOCK_DIAG = 4
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR = 0x1, 0x4, 0x300, 0x10
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
ATTRIBUTE = struct.Struct("=HH")  # rtattr / nlattr: length, type
IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
RECEIVE = 65536  # the kernel fills a dump's reads up to 32 KiB
DUMP_TRIES = 3


def setns(path: str) -> None:
    """Move this thread into the network namespace at `path` (opened read-only: never made)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _enter(fd, path)
    finally:
        os.close(fd)


def _enter(fd: int, path: str) -> None:
    setns_fd = getattr(os, "setns", None)  # Python 3.12+
    if setns_fd is not None:
        setns_fd(fd, CLONE_NEWNET)
        return
    import ctypes

    if _libc().setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), path)


@functools.cache
def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


class NamespaceStuck(RuntimeError):
    """This thread could not go back to its own network namespace: whatever the process does
    next on it (connections, sockets) would happen in the other one. Never caught as a
    NetworkError: the process must end."""


@contextlib.contextmanager
def entered(netns: str) -> Iterator[None]:
    """This thread inside the network namespace at `netns` for the block, then back in its own
    (OSError: not entered; NamespaceStuck: not back)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(netns)
        try:
            yield
        finally:
            try:
                _enter(own, "/proc/thread-self/ns/net")
            except OSError as e:
                raise NamespaceStuck(f"cannot return to this thread's network namespace from "
                                     f"{netns}: {e.strerror or e}") from None
    finally:
        os.close(own)


def socket_in(netns: str, protocol: int) -> socket.socket:
    """A netlink socket of `protocol` bound to the namespace at `netns` (a socket stays in the
    namespace it was made in)."""
    with entered(netns):
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)


def dump(sock: socket.socket, kind: int, body: bytes) -> list[bytes]:
    """Ask for every object of `kind` (a dump request whose header is followed by `body`); the
    payload of each answer, its header taken off. A dump the kernel marks as interrupted (the
    objects changed while it ran) is asked again."""
    for _ in range(DUMP_TRIES):
        answers, interrupted = _dump_once(sock, kind, body)
        if not interrupted:
            return answers
    raise OSError(f"netlink dump {kind} kept changing while it was read")


def _dump_once(sock: socket.socket, kind: int, body: bytes) -> tuple[list[bytes], bool]:
    sequence = int.from_bytes(os.urandom(4), "little") or 1
    sock.send(HEADER.pack(HEADER.size + len(body), kind, NLM_F_REQUEST | NLM_F_DUMP, sequence,
                          0) + body)
    answers: list[bytes] = []
    interrupted = False
    while True:
        data, _ancillary, flags, _address = sock.recvmsg(RECEIVE)
        if flags & socket.MSG_TRUNC:
            raise OSError(f"netlink dump {kind}: an answer longer than {RECEIVE} bytes")
        offset = 0
        while offset + HEADER.size <= len(data):
            length, kind_back, msg_flags, seq, _port = HEADER.unpack_from(data, offset)
            if length < HEADER.size or offset + length > len(data):
                raise OSError(f"netlink dump {kind}: a malformed answer")
            if seq == sequence:
                interrupted |= bool(msg_flags & NLM_F_DUMP_INTR)
                if kind_back in (NLMSG_DONE, NLMSG_ERROR):
                    _check_status(data[offset + HEADER.size:offset + length], f"netlink dump {kind}")
                    return answers, interrupted
                answers.append(data[offset + HEADER.size:offset + length])
            offset += (length + 3) & ~3


def ask(sock: socket.socket, kind: int, body: bytes, what: str) -> None:
    """One request of `kind` with `body`, acknowledged: OSError (in the kernel's words, and
    `what`) where the kernel refused it."""
    sequence = int.from_bytes(os.urandom(4), "little") or 1
    sock.send(HEADER.pack(HEADER.size + len(body), kind, NLM_F_REQUEST | NLM_F_ACK, sequence, 0)
              + body)
    while True:
        data = sock.recv(RECEIVE)
        offset = 0
        while offset + HEADER.size <= len(data):
            length, kind_back, _flags, seq, _port = HEADER.unpack_from(data, offset)
            if length < HEADER.size or offset + length > len(data):
                raise OSError(f"{what}: a malformed answer")
            if seq == sequence and kind_back == NLMSG_ERROR:
                _check_status(data[offset + HEADER.size:offset + length], what)
                return
            offset += (length + 3) & ~3


def _check_status(payload: bytes, what: str) -> None:
    """The status an NLMSG_DONE or NLMSG_ERROR carries first: 0, or the negative errno."""
    if len(payload) >= 4:
        (status,) = struct.unpack_from("=i", payload)
        if status < 0:
            raise OSError(-status, os.strerror(-status), what)


def attributes(payload: bytes, start: int) -> dict[int, bytes]:
    """The attributes that follow a message's fixed part (from `start`), by type; a nested
    attribute's value is read again with start 0."""
    found: dict[int, bytes] = {}
    for kind, value in _walk(payload, start):
        found.setdefault(kind, value)
    return found


def _walk(payload: bytes, offset: int) -> Iterator[tuple[int, bytes]]:
    while offset + ATTRIBUTE.size <= len(payload):
        length, kind = ATTRIBUTE.unpack_from(payload, offset)
        if length < ATTRIBUTE.size or offset + length > len(payload):
            return
        yield kind & NLA_TYPE_MASK, payload[offset + ATTRIBUTE.size:offset + length]
        offset += (length + 3) & ~3
