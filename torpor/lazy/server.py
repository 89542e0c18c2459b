"""CRIU's page-server protocol, the serving side, as `criu lazy-pages --page-server` speaks it.

Every message starts with a 32-byte header: u32 command, 4 bytes of padding, u64 page count,
u64 address, u64 destination (criu/page-xfer.c, CRIU 4.2). There is no handshake. The daemon
asks with GET (dst = the pid the process was dumped as, the address as it was at dump time),
several requests in flight, and reads the answers in the order it asked: each answer is a
header (ADD_F with PE_PRESENT in its upper half, the address and pid echoed, a page count of
at least one and at most the count asked) and then the pages. When every page is placed the
daemon sends CLOSE and waits for a 32-bit zero.

The one rule that matters: if this side went away, the daemon would exit and the kernel would
back every page still missing with zeros, so the workload would run on wrong memory. So the
server never gives up on a request by closing: a page it cannot get yet (the registry down)
is waited for, and when waiting is over (the deadline, a damaged chunk) `serve` raises with
the socket still open, and the caller kills the workload before it closes it.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from torpor.errors import FormatError
from torpor.lazy import pieces
from torpor.lazy.pagemap import PAGE, PE_PRESENT, Pagemap
from torpor.lazy.pieces import Piece

HEADER = struct.Struct("<I4xQQQ")
GET = 7
ADD_F = 6
CLOSE = 0x1023
CLOSE_AND_FLUSH = 0x1024
ANSWER = ADD_F | PE_PRESENT << 16
MAX_ASK = 1 << 20          # pages in one request: more is not CRIU asking
WORKERS = 8

PageReader = Callable[[str, int, int], list[Piece]]  # file, offset, length -> pieces
PagesReady = Callable[[str, int, int], bool]  # file, offset, length -> read at once (no wait)?


@dataclass
class Served:
    pages: int = 0
    done_s: float = 0.0      # CLOSE answered, after serve() started


class PageServer:
    def __init__(self, sock: socket.socket, pagemaps: dict[int, Pagemap], read: PageReader,
                 ready: PagesReady | None = None) -> None:
        """`ready`: whether `read` has the pages at hand; such a request, with no answer
        before it still to send, is answered on the receiving thread at once (CRIU's daemon
        waits for each answer before it asks for the next range, so the handoffs to a worker
        and to the sender were most of a request's time while a download shares the CPU)."""
        self.sock, self.pagemaps, self.read, self.ready = sock, pagemaps, read, ready
        self.served = Served()
        self.failure: BaseException | None = None
        self._write_lock = threading.Lock()
        self._started = time.monotonic()
        self._stop = threading.Event()

    def serve(self) -> None:
        """Answer until CLOSE; raises what stopped it otherwise (the socket left open)."""
        self._started = time.monotonic()
        answers: deque[Future[list[Piece]]] = deque()
        ready = threading.Condition()
        stop = self._stop = threading.Event()

        def writer() -> None:
            while True:
                with ready:
                    while not answers and not stop.is_set():
                        ready.wait()
                    if not answers:
                        return
                    future = answers[0]
                try:
                    self._send(future.result())
                except BaseException as e:   # a damaged chunk, the deadline: stop answering
                    if self.failure is None:
                        self.failure = e
                    stop.set()
                    return
                with ready:
                    answers.popleft()
                    ready.notify_all()

        with ThreadPoolExecutor(WORKERS, thread_name_prefix="torpor-pages") as pool:
            sender = threading.Thread(target=writer, name="torpor-pages-send", daemon=True)
            sender.start()
            try:
                while not stop.is_set():
                    header = self._receive(HEADER.size)
                    if header is None and stop.is_set():
                        break
                    if header is None:
                        raise FormatError("criu lazy-pages closed its page-server connection "
                                          "before every page was placed")
                    command, pages, vaddr, pid = HEADER.unpack(header)
                    if command in (CLOSE, CLOSE_AND_FLUSH):
                        with ready:
                            while answers and not stop.is_set():
                                ready.wait()
                        if stop.is_set():
                            break
                        self._send([struct.pack("<i", 0)])
                        self.served.done_s = time.monotonic() - self._started
                        return
                    if command != GET or not 0 < pages <= MAX_ASK:
                        raise FormatError(f"criu lazy-pages sent command {command:#x} for "
                                          f"{pages} pages, which torpor does not serve")
                    where = self._locate(pid, vaddr, pages)
                    with ready:
                        alone = not answers
                    if alone and self.ready is not None and self.ready(*where):
                        self._send(self._answer(pid, vaddr, *where))
                        continue
                    future = pool.submit(self._answer, pid, vaddr, *where)
                    with ready:
                        answers.append(future)
                        ready.notify_all()
            finally:
                stop.set()
                with ready:
                    ready.notify_all()
                sender.join()
                for future in answers:
                    future.cancel()
        raise self.failure or FormatError("the page server stopped")

    def _locate(self, pid: int, vaddr: int, pages: int) -> tuple[str, int, int]:
        """The pages file, offset and length of what CRIU asks for, up to the end of its run."""
        pagemap = self.pagemaps.get(pid)
        run = pagemap.find(vaddr) if pagemap else None
        if pagemap is None or run is None or not run.lazy:
            raise FormatError(f"criu lazy-pages asked for a page at {vaddr:#x} of process {pid}, "
                              "which the checkpoint does not hold as a lazy page")
        first = (vaddr - run.vaddr) // PAGE
        count = min(pages, run.pages - first)
        return pagemap.pages_file, run.offset + first * PAGE, count * PAGE

    def _answer(self, pid: int, vaddr: int, pages_file: str, offset: int,
                length: int) -> list[Piece]:
        data = self.read(pages_file, offset, length)
        return [HEADER.pack(ANSWER, length // PAGE, vaddr, pid), *data]

    def _send(self, message: list[Piece]) -> None:
        with self._write_lock:
            size = pieces.send(self.sock, message)
        if size > 4:
            self.served.pages += (size - HEADER.size) // PAGE

    def _receive(self, n: int) -> bytes | None:
        """`n` bytes; None at the end of the stream, or once the writer has stopped."""
        data = bytearray()
        readable = select.poll()   # not select(): descriptors may go past 1024 (session.py)
        readable.register(self.sock, select.POLLIN)
        while len(data) < n:
            ready = readable.poll(100)
            if self._stop.is_set():
                return None
            if not ready:
                continue
            piece = self.sock.recv(n - len(data))
            if not piece:
                return None
            data += piece
        return bytes(data)
