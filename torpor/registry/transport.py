"""HTTP on the standard library's http.client: pooled keep-alive connections, TLS, streamed bodies.

Why http.client (docs/registry.md): a body is sent from a file in 1 MiB reads that also feed the
digest and the progress bar, and a download is read into a reused buffer, so no blob is ever held
in memory; Content-Range, Range and Location are under this module's control; no dependency.

Scheme: https, verified against the system CAs or `ca_file`. Plain http only for a loopback
registry or an `insecure` one, and only when its port does not speak TLS (probed once per host).
This module raises only RegistryError, through http_errors.
"""

from __future__ import annotations

import http.client
import select
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol
from urllib.parse import urlsplit

from torpor.errors import RegistryError
from torpor.registry import http_errors
from torpor.registry.options import RegistryOptions
from torpor.registry.reference import is_loopback_host
from torpor.registry.response import BUFFER_SIZE, Response

IDLE_PER_HOST = 16
USER_AGENT = "torpor-registry/0.1"

Connection = http.client.HTTPConnection
ChunkObserver = Callable[[memoryview], None]


class ReadableFile(Protocol):
    def readinto(self, buffer: memoryview, /) -> int | None: ...


class Transport:
    """Connections to one registry host (and, for tokens or redirects, to others)."""

    def __init__(self, registry: str, options: RegistryOptions,
                 schemes: dict[str, str] | None = None) -> None:
        """`schemes`: hosts whose scheme the node's configuration gives (a hosts.toml URL),
        used as given, plain http included, never probed."""
        self.registry, self.options = registry, options
        self._idle: dict[tuple[str, str], list[Connection]] = {}
        self._given = dict(schemes or {})
        self._schemes: dict[str, str] = dict(self._given)
        self._lock = threading.Lock()
        self._tls: ssl.SSLContext | None = None  # made on first use: loading the CAs takes ~40 ms

    def base_url(self, host: str) -> str:
        """scheme://host for a registry host, probing once whether plain http is in use."""
        with self._lock:
            scheme = self._schemes.get(host)
        if scheme is None:
            scheme = self._probe_scheme(host)
            with self._lock:
                self._schemes[host] = scheme
        return f"{scheme}://{host}"

    def open(self, method: str, url: str, headers: dict[str, str], what: str,
             body: bytes | None = None, body_file: ReadableFile | None = None, body_length: int = 0,
             observe: ChunkObserver | None = None) -> Response:
        """One request, one attempt. `body_file` sends `body_length` bytes from its position,
        passing each read to `observe`. Network failures raise RegistryError."""
        parts = urlsplit(url)
        key = (parts.scheme, parts.netloc)
        self._check_scheme_allowed(parts.scheme, parts.netloc, parts.hostname or "", what)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn = self._acquire(key)
        try:
            conn.putrequest(method, path or "/", skip_accept_encoding=True)
            length = len(body) if body is not None else body_length if body_file is not None else 0
            all_headers = {"User-Agent": USER_AGENT, **headers}
            if method in ("POST", "PUT", "PATCH") or length:
                all_headers["Content-Length"] = str(length)
            for name, value in all_headers.items():
                conn.putheader(name, value)
            conn.endheaders()
            body_sent = True
            try:
                if body:
                    conn.send(body)
                elif body_file is not None:
                    _send_file(conn, body_file, body_length, observe)
            except (BrokenPipeError, ConnectionResetError):
                body_sent = False  # the registry may have answered (401, 413) before reading it all
            answer = conn.getresponse()
        except (*http_errors.FOREIGN,) as e:
            self.release(key, conn, False)
            raise self.network_error(e, what) from None
        return Response(answer, url, what, lambda reusable: self.release(key, conn, reusable and body_sent),
                        self.network_error)

    def network_error(self, exc: BaseException, what: str) -> RegistryError:
        return http_errors.from_network(exc, self.registry, what, self.options.timeout_s)

    def release(self, key: tuple[str, str], conn: Connection, reusable: bool) -> None:
        if not reusable:
            conn.close()
            return
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < IDLE_PER_HOST:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def _acquire(self, key: tuple[str, str]) -> Connection:
        """An idle connection the server has not closed meanwhile, else a new one."""
        while True:
            with self._lock:
                idle = self._idle.get(key)
                conn = idle.pop() if idle else None
            if conn is None:
                break
            if not _closed_by_peer(conn):
                return conn
            conn.close()
        scheme, netloc = key
        timeout = self.options.timeout_s
        if scheme == "https":
            return http.client.HTTPSConnection(netloc, timeout=timeout, context=self._tls_context())
        return http.client.HTTPConnection(netloc, timeout=timeout)

    def _plain_http_allowed(self, hostname: str) -> bool:
        return self.options.insecure or is_loopback_host(hostname)

    def _check_scheme_allowed(self, scheme: str, netloc: str, hostname: str, what: str) -> None:
        if scheme == "http" and self._given.get(netloc) == "http":
            return   # the node's hosts.toml says http://
        if scheme == "http" and not self._plain_http_allowed(hostname):
            raise RegistryError(f"refusing plain http to {hostname} for {what}",
                                hint="only loopback or --insecure registries may use plain http")
        if scheme not in ("http", "https"):
            raise RegistryError(f"unsupported URL scheme {scheme!r} for {what}")

    def _probe_scheme(self, host: str) -> str:
        hostname = urlsplit(f"//{host}").hostname or host
        if not self._plain_http_allowed(hostname):
            return "https"
        probe = http.client.HTTPSConnection(host, timeout=self.options.timeout_s, context=_PROBE_CONTEXT)
        try:
            probe.connect()  # a handshake only: whether the port speaks TLS, not whom to trust
        except ssl.SSLError:
            return "http"  # the port answers, but not with TLS
        except (*http_errors.FOREIGN,) as e:
            raise self.network_error(e, "connecting") from None
        finally:
            probe.close()
        return "https"

    def _tls_context(self) -> ssl.SSLContext:
        with self._lock:
            if self._tls is None:
                self._tls = _tls_context(self.options)
            return self._tls


def _closed_by_peer(conn: Connection) -> bool:
    """An idle keep-alive socket that is readable has been closed (or spoken to) by the server."""
    sock = conn.sock
    if sock is None:
        return True
    poller = select.poll()   # not select(): a lazy restore may hold descriptors past 1024
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _send_file(conn: Connection, body_file: ReadableFile, length: int, observe: ChunkObserver | None) -> None:
    buffer = memoryview(bytearray(min(BUFFER_SIZE, max(length, 1))))
    remaining = length
    while remaining:
        n = body_file.readinto(buffer[:min(remaining, len(buffer))])
        if not n:
            raise OSError(f"the file ended {remaining} bytes early")
        chunk = buffer[:n]
        if observe is not None:
            observe(chunk)
        conn.send(chunk)
        remaining -= n


def _probe_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


_PROBE_CONTEXT = _probe_context()


def _tls_context(options: RegistryOptions) -> ssl.SSLContext:
    context = _verifying_context(options)
    for cert, key in options.client_certs:   # a hosts.toml's `client`
        try:
            context.load_cert_chain(str(cert), str(key) if key else None)
        except (OSError, ssl.SSLError) as e:
            raise RegistryError(f"cannot load the client certificate {cert}: {e}",
                                hint="hosts.toml's client = [cert, key] takes PEM files") from None
    return context


def _verifying_context(options: RegistryOptions) -> ssl.SSLContext:
    if options.insecure or options.skip_verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    cafile = options.ca_file
    try:
        context = ssl.create_default_context(cafile=str(cafile) if cafile else None)
        for cafile in options.ca_files:
            context.load_verify_locations(cafile=str(cafile))
    except (OSError, ssl.SSLError) as e:
        raise RegistryError(f"cannot load the CA file {cafile}: {e}",
                            hint="--ca-file and hosts.toml's ca take PEM files of CA "
                                 "certificates") from None
    return context


def backoff_delays(options: RegistryOptions) -> Iterator[float]:
    """Sleeps between attempts: backoff, doubling, `retries` times."""
    delay = options.backoff_s
    for _ in range(options.retries):
        yield delay
        delay *= 2


def sleep(seconds: float) -> None:
    time.sleep(seconds)
