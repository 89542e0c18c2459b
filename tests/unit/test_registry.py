"""Tables for the pure parts: references, challenges, scopes, docker config, error mapping, digests."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.registry import credential_helper, docker_config
from torpor.errors import AuthError, ConfigError, ImageError, RegistryError
from torpor.formats.digests import split_digest
from torpor.registry import RegistryOptions, parse_reference
from torpor.registry.auth import merge_scopes, parse_challenges
from torpor.registry.credentials import Credentials, find_credentials
from torpor.registry.http_errors import FOREIGN, TransientError, from_network, from_response
from torpor.registry.layout import Layout
from torpor.registry.transport import Transport

HEX = "a" * 64


@pytest.mark.parametrize(("text", "registry", "repository", "tag", "digest", "api_host"), [
    ("registry.example/team/web1:ckpt-1", "registry.example", "team/web1", "ckpt-1", None,
     "registry.example"),
    (f"host:5000/repo@sha256:{HEX}", "host:5000", "repo", None, f"sha256:{HEX}", "host:5000"),
    (f"host:5000/a/b:t@sha256:{HEX}", "host:5000", "a/b", "t", f"sha256:{HEX}", "host:5000"),
    ("redis", "docker.io", "library/redis", None, None, "registry-1.docker.io"),
    ("redis:7", "docker.io", "library/redis", "7", None, "registry-1.docker.io"),
    ("docker.io/bitnami/redis:7", "docker.io", "bitnami/redis", "7", None, "registry-1.docker.io"),
    ("index.docker.io/redis", "docker.io", "library/redis", None, None, "registry-1.docker.io"),
    ("team/web1:1", "docker.io", "team/web1", "1", None, "registry-1.docker.io"),
    ("localhost/web1", "localhost", "web1", None, None, "localhost"),
    ("localhost:5000/web1:latest", "localhost:5000", "web1", "latest", None, "localhost:5000"),
    ("127.0.0.1:5000/a/b/c:v1.2-3_x", "127.0.0.1:5000", "a/b/c", "v1.2-3_x", None, "127.0.0.1:5000"),
    ("[::1]:5000/web1:1", "[::1]:5000", "web1", "1", None, "[::1]:5000"),
])
def test_references(text: str, registry: str, repository: str, tag: str | None, digest: str | None,
                    api_host: str) -> None:
    ref = parse_reference(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest, ref.api_host) == (
        registry, repository, tag, digest, api_host)


def test_reference_properties() -> None:
    assert parse_reference("127.0.0.1:5000/a:1").is_loopback
    assert parse_reference("[::1]:5000/a:1").is_loopback
    assert parse_reference("localhost/a").is_loopback
    assert not parse_reference("registry.example/a").is_loopback
    assert parse_reference("registry.example/a").reference == "latest"
    assert str(parse_reference("redis:7")) == "docker.io/library/redis:7"


@pytest.mark.parametrize("text", ["", "UPPER/case", "host:5000/", "a//b", "repo:bad tag", "repo@sha256:zz",
                                  "repo:" + "t" * 129, "-leading/dash"])
def test_bad_references(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid image reference"):
        parse_reference(text)


def test_challenges() -> None:
    found = parse_challenges([
        'Bearer realm="https://auth.example/token",service="registry.example",'
        'scope="repository:team/web1:pull,push"',
        'Basic realm="x", Bearer realm="https://b/t"'])
    assert [(c.scheme, c.params) for c in found] == [
        ("bearer", {"realm": "https://auth.example/token", "service": "registry.example",
                    "scope": "repository:team/web1:pull,push"}),
        ("basic", {"realm": "x"}),
        ("bearer", {"realm": "https://b/t"})]
    assert parse_challenges(['Basic realm="quoted \\"name\\""'])[0].params["realm"] == 'quoted "name"'


def test_merge_scopes() -> None:
    assert merge_scopes("repository:a:pull", "repository:a:pull,push") == "repository:a:pull,push"
    assert merge_scopes("repository:b:pull,push repository:a:pull", "") == \
        "repository:a:pull repository:b:pull,push"


def test_docker_config_entries(tmp_path: Path) -> None:
    config = docker_config(tmp_path, auths={"https://registry.example/v2/": ("u1", "p:1"),
                                            "https://index.docker.io/v1/": ("hub", "h")})
    assert find_credentials("registry.example", config) == Credentials("u1", "p:1", source=str(config))
    found = find_credentials("docker.io", config)
    assert found is not None and (found.username, found.password) == ("hub", "h")
    assert find_credentials("other.example", config) is None
    assert find_credentials("x", tmp_path / "absent.json") is None
    assert "p:1" not in repr(find_credentials("registry.example", config))


def test_identity_tokens_and_bad_entries(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"auths": {"a.example": {"identitytoken": "refresh-me"},
                                          "b.example": {"auth": base64.b64encode(b"nocolon").decode()}}}))
    found = find_credentials("a.example", path)
    assert found is not None and found.identity_token == "refresh-me" and "refresh-me" not in repr(found)
    with pytest.raises(AuthError, match="not base64 of user:password"):
        find_credentials("b.example", path)


def test_credential_helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    credential_helper(tmp_path / "bin", "unit", {"a.example": ("ann", "s3cret"),
                                                 "https://index.docker.io/v1/": ("<token>", "idtok")})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    config = docker_config(tmp_path / "d", creds_store="unit", auths={"c.example": ("cfg", "pw")})
    assert find_credentials("a.example", config) == Credentials("ann", "s3cret",
                                                                source="docker-credential-unit")
    hub = find_credentials("docker.io", config)
    assert hub is not None and hub.identity_token == "idtok"
    assert find_credentials("c.example", config) == Credentials("cfg", "pw", source=str(config))
    missing = docker_config(tmp_path / "m", cred_helpers={"a.example": "not-installed"})
    with pytest.raises(AuthError, match="docker-credential-not-installed is not on PATH"):
        find_credentials("a.example", missing)


FOREIGN_SAMPLES: list[BaseException] = [
    ConnectionRefusedError(111, "Connection refused"), ConnectionResetError(104, "reset"),
    BrokenPipeError(32, "Broken pipe"), TimeoutError("timed out"),
    socket.gaierror(-2, "Name or service not known"),
    ssl.SSLCertVerificationError(1, "certificate verify failed"), ssl.SSLError(1, "wrong version number"),
    http.client.IncompleteRead(b"", 10), http.client.RemoteDisconnected("closed"),
    http.client.BadStatusLine("garbage"), http.client.HTTPException("odd"), OSError(5, "Input/output error"),
]


@pytest.mark.parametrize("exc", FOREIGN_SAMPLES, ids=lambda e: type(e).__name__)
def test_every_foreign_exception_is_translated(exc: BaseException) -> None:
    assert isinstance(exc, FOREIGN)
    error = from_network(exc, "r.example", "GET blob sha256:x", 30)
    assert isinstance(error, RegistryError) and "r.example" in error.message
    transient = isinstance(exc, ConnectionResetError | BrokenPipeError | TimeoutError
                           | http.client.IncompleteRead | http.client.BadStatusLine)
    assert isinstance(error, TransientError) == transient


@pytest.mark.parametrize(("status", "code", "kind", "words"), [
    (401, "UNAUTHORIZED", AuthError, "docker login"),
    (403, "DENIED", AuthError, "rights"),
    (404, "MANIFEST_UNKNOWN", RegistryError, "tag or digest"),
    (404, "BLOB_UNKNOWN", RegistryError, "push the checkpoint again"),
    (400, "MANIFEST_INVALID", RegistryError, "allow-list"),
    (400, "DIGEST_INVALID", RegistryError, "corrupted"),
    (413, "SIZE_INVALID", RegistryError, "size limit"),
    (429, "TOOMANYREQUESTS", TransientError, "rate-limits"),
    (503, "UNAVAILABLE", TransientError, "retry later"),
])
def test_registry_answers_are_translated(status: int, code: str, kind: type, words: str) -> None:
    body = json.dumps({"errors": [{"code": code, "message": "said by the registry", "detail": "d"}]}).encode()
    error = from_response(status, body, "PUT manifest team/web1:1", "r.example")
    assert type(error) is kind and error.status == status
    assert code in str(error) and "said by the registry: d" in str(error) and words in str(error)


@pytest.mark.parametrize("digest", ["sha256:../../etc/passwd", "sha256:" + "A" * 64, "md5:" + "a" * 32,
                                    "sha256:" + "a" * 63, "sha512:" + "a" * 64, "../sha256:" + "a" * 64])
def test_digests_that_could_name_other_files_are_refused(digest: str, tmp_path: Path) -> None:
    with pytest.raises(ImageError):
        split_digest(digest)
    with pytest.raises(ImageError):
        Layout(tmp_path).blob_path(digest)


def test_plain_http_only_for_loopback_or_insecure() -> None:
    transport = Transport("r.example", RegistryOptions())
    with pytest.raises(RegistryError, match="refusing plain http"):
        transport.open("GET", "http://r.example/v2/", {}, "ping")
    assert transport.base_url("r.example:443") == "https://r.example:443"  # no probe off loopback


class _ChunkedManifest(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        self.send_header("Transfer-Encoding", "chunked")  # no Content-Length: the limit applies while reading
        self.end_headers()
        chunk = b" " * 65536
        try:
            for _ in range(200):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_manifest_limit_applies_while_reading() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ChunkedManifest)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    try:
        transport = Transport(host, RegistryOptions())
        response = transport.open("GET", f"http://{host}/v2/a/manifests/1", {}, "GET manifest a:1")
        with pytest.raises(RegistryError, match="GET manifest a:1 is larger than the limit of 1048576 bytes"):
            response.read_limited(1 << 20)
    finally:
        server.shutdown()
        server.server_close()
