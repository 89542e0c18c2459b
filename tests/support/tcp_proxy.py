"""A loopback TCP proxy that can drop one connection in the middle of an HTTP upload.

`DroppingProxy(upstream_port, nth=n, method=b"PATCH", body_bytes=k)` forwards everything, except
that on the n-th blob-upload request of that method it forwards the request's headers and `k`
bytes of its body, then closes both sides of that connection, once. It counts the bytes it
forwarded to the registry, so tests can tell a resumed upload from one that started again.
"""

from __future__ import annotations

import socket
import threading

HEADER_END = b"\r\n\r\n"


class DroppingProxy:
    def __init__(self, upstream_port: int, nth: int = 2, method: bytes = b"PATCH",
                 body_bytes: int = 0) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.nth, self.body_bytes = nth, body_bytes
        self.request_line = method + b" /v2/"
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.host = f"127.0.0.1:{self.port}"
        self.seen = 0
        self.dropped = False
        self.forwarded_upstream = 0  # bytes from clients to the registry, headers included
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closing = True
        self.listener.close()
        with self._lock:
            for s in self._sockets:
                _close(s)

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                self._sockets += [client, upstream]
            self._forward(client, upstream)

    def _forward(self, client: socket.socket, upstream: socket.socket) -> None:
        """Start the threads that carry one connection, each way."""
        threading.Thread(target=self._client_to_upstream, args=(client, upstream), daemon=True).start()
        threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
        except OSError:
            pass
        _close(source)
        _close(sink)

    def _client_to_upstream(self, client: socket.socket, upstream: socket.socket) -> None:
        budget: int | None = None  # body bytes still to forward before the drop
        try:
            while data := client.recv(1 << 16):
                if budget is None and (headers_end := self._request_to_drop(data)) is not None:
                    self._send(upstream, data[:headers_end])
                    data, budget = data[headers_end:], self.body_bytes
                if budget is not None:
                    self._send(upstream, data[:budget])
                    budget -= min(budget, len(data))
                    if budget == 0:
                        break
                    continue
                self._send(upstream, data)
        except OSError:
            pass
        _close(client)
        _close(upstream)

    def _request_to_drop(self, data: bytes) -> int | None:
        """If `data` starts the upload request to drop, where its headers end."""
        start = data.find(self.request_line)
        if self.dropped or start < 0 or b"/blobs/uploads/" not in data[start:start + 200]:
            return None
        with self._lock:
            self.seen += 1
            if self.seen != self.nth:
                return None
            self.dropped = True
        end = data.find(HEADER_END, start)
        assert end >= 0, "the request's headers did not arrive in one read"
        return end + len(HEADER_END)

    def _send(self, upstream: socket.socket, data: bytes) -> None:
        upstream.sendall(data)
        self._count(len(data))

    def _count(self, n: int) -> None:
        with self._lock:
            self.forwarded_upstream += n


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


class DownloadDroppingProxy(DroppingProxy):
    """Forwards everything, except that the answers to the `nth` and later blob GETs (`times`
    of them; 0: all) stop after their headers and `body_bytes` bytes of body: the connection
    closes mid-download. Counts the body bytes it let through to clients."""

    def __init__(self, upstream_port: int, nth: int = 1, body_bytes: int = 0,
                 times: int = 1) -> None:
        self.times = times
        self.forwarded_down = 0
        super().__init__(upstream_port, nth=nth, method=b"GET", body_bytes=body_bytes)

    def _forward(self, client: socket.socket, upstream: socket.socket) -> None:
        armed = threading.Event()
        threading.Thread(target=self._requests, args=(client, upstream, armed),
                         daemon=True).start()
        threading.Thread(target=self._answers, args=(upstream, client, armed),
                         daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket,
                  armed: threading.Event) -> None:
        try:
            while data := client.recv(1 << 16):
                start = data.find(b"GET /v2/")
                if start >= 0 and b"/blobs/sha256:" in data[start:start + 300]:
                    with self._lock:
                        self.seen += 1
                        due = self.seen >= self.nth and (
                            self.times == 0 or self.seen < self.nth + self.times)
                    if due:
                        armed.set()
                self._send(upstream, data)
        except OSError:
            pass
        _close(client)
        _close(upstream)

    def _answers(self, upstream: socket.socket, client: socket.socket,
                 armed: threading.Event) -> None:
        budget: int | None = None
        buffered = b""
        try:
            while data := upstream.recv(1 << 16):
                if armed.is_set() and budget is None:
                    buffered += data
                    end = buffered.find(HEADER_END)
                    if end < 0:
                        continue
                    client.sendall(buffered[:end + len(HEADER_END)])
                    data, buffered, budget = buffered[end + len(HEADER_END):], b"", self.body_bytes
                if budget is not None:
                    client.sendall(data[:budget])
                    self._count_down(min(budget, len(data)))
                    budget -= min(budget, len(data))
                    if budget == 0:
                        self.dropped = True
                        break
                    continue
                client.sendall(data)
                self._count_down(len(data))
        except OSError:
            pass
        _close(upstream)
        _close(client)

    def _count_down(self, n: int) -> None:
        with self._lock:
            self.forwarded_down += n


class ThrottledProxy(DroppingProxy):
    """Forwards everything, answers at most `bytes_per_s` (all connections together), so a
    transfer lasts long enough for a test to cut it; `close()` then makes the registry gone:
    every connection closed, new ones refused."""

    def __init__(self, upstream_port: int, bytes_per_s: int) -> None:
        self.bytes_per_s = bytes_per_s
        self._next_send = 0.0
        super().__init__(upstream_port, nth=0)

    def _forward(self, client: socket.socket, upstream: socket.socket) -> None:
        threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=self._slow, args=(upstream, client), daemon=True).start()

    def _slow(self, upstream: socket.socket, client: socket.socket) -> None:
        import time

        try:
            while data := upstream.recv(1 << 14):
                with self._lock:
                    now = time.monotonic()
                    start = max(now, self._next_send)
                    self._next_send = start + len(data) / self.bytes_per_s
                time.sleep(max(0.0, start - now))
                client.sendall(data)
        except OSError:
            pass
        _close(upstream)
        _close(client)

    def close(self) -> None:
        self._closing = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)   # wakes the accept: refused from now on
        except OSError:
            pass
        super().close()
