"""A loopback HTTP server standing for the blob storage a registry redirects to (a CDN), and
for any other host a test wants to watch.

docker-registry's `redirect` storage middleware (Registry(redirect_blobs=...)) answers a blob
GET or HEAD with a 307 to `<base URL>/docker/registry/v2/blobs/...`; `BlobCdn(storage)` serves
those paths from the registry's storage directory, as a CDN in front of the same bucket would.
Set `challenge` to a WWW-Authenticate value to answer every request 401 with it instead; with
no storage it answers 404. Every request is recorded: method, path and its headers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]


class BlobCdn:
    def __init__(self, storage: Path | None = None) -> None:
        self.storage = storage
        self.challenge: str | None = None
        self.seen: list[Seen] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server._answer(self, body=True)

            def do_HEAD(self) -> None:
                server._answer(self, body=False)

            def do_POST(self) -> None:
                server._answer(self, body=True)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._lock = threading.Lock()
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def authorizations(self) -> list[str]:
        return [s.headers["Authorization"] for s in self.seen if "Authorization" in s.headers]

    def _answer(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        with self._lock:
            self.seen.append(Seen(request.command, request.path, dict(request.headers.items())))
        path = request.path.split("?", 1)[0].lstrip("/")
        file = self.storage / path if self.storage is not None and ".." not in path else None
        if self.challenge is not None:
            request.send_response(401)
            request.send_header("WWW-Authenticate", self.challenge)
            request.send_header("Content-Length", "0")
            request.end_headers()
        elif file is None or not file.is_file():
            request.send_response(404)
            request.send_header("Content-Length", "0")
            request.end_headers()
        else:
            data = file.read_bytes()
            request.send_response(200)
            request.send_header("Content-Length", str(len(data)))
            request.end_headers()
            if body:
                request.wfile.write(data)
