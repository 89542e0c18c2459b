"""The page-server side of CRIU's protocol (torpor/lazy/server.py) against a client that
speaks as `criu lazy-pages` does: pipelined GETs answered in order, partial answers at the end
of a run, CLOSE answered by a zero; a page it cannot get stops the server without closing.
Pages at hand are answered on the receiving thread, still in the order asked."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from torpor.errors import DigestMismatch, FormatError
from torpor.lazy.pagemap import PAGE, Pagemap, Run
from torpor.lazy.server import ANSWER, CLOSE, GET, HEADER, PageReader, PageServer, PagesReady

PID = 7
MAP = Pagemap(PID, "pages-1.img", (Run(0x10000, 4, True, 0), Run(0x20000, 2, False, 4 * PAGE),
                                    Run(0x30000, 3, True, 6 * PAGE)))
FILE = b"".join(bytes([n]) * PAGE for n in range(9))


def read(name: str, offset: int, length: int) -> list[bytes | memoryview]:
    assert name == "pages-1.img"
    return [FILE[offset:offset + PAGE], memoryview(FILE)[offset + PAGE:offset + length]]


def serve(reader: PageReader = read, ready: PagesReady | None = None
          ) -> tuple[socket.socket, threading.Thread, list[BaseException]]:
    ours, theirs = socket.socketpair()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            PageServer(ours, {PID: MAP}, reader, ready).serve()
        except BaseException as e:
            failures.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return theirs, thread, failures


def answer(sock: socket.socket) -> tuple[int, int, int, int, bytes]:
    head = sock.recv(HEADER.size, socket.MSG_WAITALL)
    command, pages, vaddr, pid = HEADER.unpack(head)
    return command, pages, vaddr, pid, sock.recv(pages * PAGE, socket.MSG_WAITALL)


def test_pipelined_gets_are_answered_in_order_and_close_with_a_zero() -> None:
    client, thread, failures = serve()
    client.sendall(HEADER.pack(GET, 8, 0x11000, PID) + HEADER.pack(GET, 1, 0x32000, PID))
    assert answer(client) == (ANSWER, 3, 0x11000, PID, FILE[PAGE:4 * PAGE])  # to the run's end
    assert answer(client) == (ANSWER, 1, 0x32000, PID, FILE[8 * PAGE:9 * PAGE])
    client.sendall(HEADER.pack(CLOSE, 0, 0, 0))
    assert struct.unpack("<i", client.recv(4, socket.MSG_WAITALL)) == (0,)
    thread.join(5)
    assert not failures


def test_a_page_that_is_not_lazy_or_not_there_stops_the_server_socket_open() -> None:
    for vaddr in (0x20000, 0x40000):   # CRIU restores the first itself; the second is no page
        client, thread, failures = serve()
        client.sendall(HEADER.pack(GET, 1, vaddr, PID))
        thread.join(5)
        assert isinstance(failures[0], FormatError)
        client.setblocking(False)
        with pytest.raises(BlockingIOError):   # no answer, and no end of stream either
            client.recv(1)


def test_a_damaged_chunk_is_never_sent() -> None:
    def damaged(name: str, offset: int, length: int) -> list[bytes | memoryview]:
        raise DigestMismatch("pack sha256:ab: chunk at offset 0 does not match its digest")

    client, thread, failures = serve(damaged)
    client.sendall(HEADER.pack(GET, 1, 0x10000, PID))
    thread.join(5)
    assert isinstance(failures[0], DigestMismatch)
    client.setblocking(False)
    with pytest.raises(BlockingIOError):
        client.recv(1)


def test_pages_at_hand_are_answered_at_once_but_never_before_an_earlier_answer() -> None:
    """The first GET's pages are not at hand and come late; the second's are: its answer
    still follows the first's. Then, with nothing queued, one at hand is answered at once."""
    release = threading.Event()
    readers: dict[int, threading.Thread] = {}

    def slow_first(name: str, offset: int, length: int) -> list[bytes | memoryview]:
        readers[offset] = threading.current_thread()
        if offset == 0:
            assert release.wait(5)
        return read(name, offset, length)

    def at_hand(name: str, offset: int, length: int) -> bool:
        return offset != 0

    client, thread, failures = serve(slow_first, at_hand)
    client.sendall(HEADER.pack(GET, 1, 0x10000, PID) + HEADER.pack(GET, 1, 0x30000, PID))
    time.sleep(0.2)
    client.setblocking(False)
    with pytest.raises(BlockingIOError):   # the second, at hand, waits for the first
        client.recv(1)
    client.setblocking(True)
    release.set()
    assert answer(client) == (ANSWER, 1, 0x10000, PID, FILE[:PAGE])
    assert answer(client) == (ANSWER, 1, 0x30000, PID, FILE[6 * PAGE:7 * PAGE])
    # the sender takes an answer off its queue once its send has returned, which may be after
    # the client has read it: give it that moment, so that nothing is queued
    time.sleep(0.1)
    client.sendall(HEADER.pack(GET, 2, 0x31000, PID))
    assert answer(client) == (ANSWER, 2, 0x31000, PID, FILE[7 * PAGE:9 * PAGE])
    assert readers[7 * PAGE] is thread and readers[0] is not thread   # at once; by a worker
    client.sendall(HEADER.pack(CLOSE, 0, 0, 0))
    assert struct.unpack("<i", client.recv(4, socket.MSG_WAITALL)) == (0,)
    thread.join(5)
    assert not failures


def test_a_damaged_chunk_at_hand_is_never_sent() -> None:
    readers: list[threading.Thread] = []

    def damaged(name: str, offset: int, length: int) -> list[bytes | memoryview]:
        readers.append(threading.current_thread())
        raise DigestMismatch("pack sha256:ab: chunk at offset 0 does not match its digest")

    client, thread, failures = serve(damaged, lambda name, offset, length: True)
    client.sendall(HEADER.pack(GET, 1, 0x10000, PID))
    thread.join(5)
    assert readers == [thread]   # read on the receiving thread, and nothing sent
    assert isinstance(failures[0], DigestMismatch)
    client.setblocking(False)
    with pytest.raises(BlockingIOError):
        client.recv(1)
