"""A bearer-token server for docker-registry's `auth: token`, as Docker Hub or Harbor run one.

GET /token?service=...&scope=... with Basic credentials (or none) answers a JWT signed RS256
with a key openssl made; the registry trusts it through the certificate in `x5c`. A user with
the right password gets every action asked for; anonymous callers get `pull` on repositories
under `public/` and nothing else; a wrong password is a 401. Each request is counted, so tests
can see tokens being reused.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

ISSUER = "torpor-test-issuer"
SERVICE = "torpor-test-registry"
_SHA256_PREFIX = bytes.fromhex("3031300d060960864801650304020105000420")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class SigningKey:
    """An RSA key and self-signed certificate from openssl; PKCS#1 v1.5 signatures in Python."""

    def __init__(self, directory: Path) -> None:
        self.key_file, self.cert_file = directory / "token-key.pem", directory / "token-cert.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        str(self.key_file), "-out", str(self.cert_file), "-days", "2",
                        "-subj", "/CN=torpor-test-token-issuer"], check=True, capture_output=True)
        text = subprocess.run(["openssl", "rsa", "-in", str(self.key_file), "-noout", "-text"],
                              check=True, capture_output=True, text=True).stdout
        self.modulus = self._field(text, "modulus")
        self.private_exponent = self._field(text, "privateExponent")
        der = subprocess.run(["openssl", "x509", "-in", str(self.cert_file), "-outform", "DER"],
                             check=True, capture_output=True).stdout
        self.x5c = base64.b64encode(der).decode()

    @staticmethod
    def _field(text: str, name: str) -> int:
        match = re.search(rf"^{name}:\s*\n((?:\s+[0-9a-f:]+\n)+)", text, re.MULTILINE)
        assert match, f"openssl rsa -text has no {name}"
        return int(re.sub(r"[\s:]", "", match.group(1)), 16)

    def sign(self, message: bytes) -> bytes:
        size = (self.modulus.bit_length() + 7) // 8
        digest_info = _SHA256_PREFIX + hashlib.sha256(message).digest()
        padded = b"\x00\x01" + b"\xff" * (size - len(digest_info) - 3) + b"\x00" + digest_info
        return pow(int.from_bytes(padded, "big"), self.private_exponent, self.modulus).to_bytes(size, "big")


class TokenServer:
    def __init__(self, directory: Path, users: dict[str, str], lifetime_s: int = 300) -> None:
        self.key = SigningKey(directory)
        self.users, self.lifetime_s = users, lifetime_s
        self.requests: list[tuple[str | None, list[str]]] = []  # (user, scopes)
        server = self
        self._lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server._answer(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.httpd.server_address[1]}/token"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def registry_settings(self) -> dict[str, str]:
        return {"realm": self.realm, "service": SERVICE, "issuer": ISSUER, "certs": str(self.key.cert_file)}

    def start(self) -> TokenServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        query = parse_qs(urlsplit(request.path).query)
        scopes = query.get("scope", [])
        user = self._user(request.headers.get("Authorization"))
        with self._lock:
            self.requests.append((user if user is not False else "<rejected>", scopes))  # type: ignore[arg-type]
        if user is False:
            request.send_response(401)
            request.send_header("Content-Length", "0")
            request.end_headers()
            return
        access = []
        for scope in " ".join(scopes).split():
            kind, name, actions = scope.split(":")
            granted = actions.split(",") if user else (["pull"] if name.startswith("public/") else [])
            access.append({"type": kind, "name": name, "actions": granted})
        token = self._token(user or "", access)
        body = json.dumps({"token": token, "expires_in": self.lifetime_s}).encode()
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    def _user(self, header: str | None) -> str | bool | None:
        """The authenticated user, None when anonymous, False when the password is wrong."""
        if not header or not header.startswith("Basic "):
            return None
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        return user if self.users.get(user) == password else False

    def _token(self, subject: str, access: list[dict[str, object]]) -> str:
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.key.x5c]}
        claims = {"iss": ISSUER, "sub": subject, "aud": SERVICE, "exp": now + self.lifetime_s,
                  "nbf": now - 10, "iat": now, "jti": f"{now}-{len(self.requests)}", "access": access}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        return f"{signing_input}.{_b64url(self.key.sign(signing_input.encode()))}"
