"""Private docker-registry (distribution 2.8) instances on loopback, and the tools to break them.
Deletes are allowed unless `delete=False` (REGISTRY_STORAGE_DELETE_ENABLED).

Each `Registry` runs `docker-registry serve CONFIG` on a free 127.0.0.1 port with filesystem
storage under its own directory, optionally behind htpasswd basic auth, a bearer token server
(tests/support/token_server.py) or a self-signed TLS certificate made with openssl, and with
blob downloads redirected to another server (`redirect_blobs`: tests/support/blob_cdn.py). It is
stopped by pid. `blob_data(digest)` is the file the registry serves a blob or manifest from,
for the tests that tamper with storage.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from .netns import NetNS
from .processes import free_port, port_open, stop, wait_for

CONFIG = """\
version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: {delete}
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: {listen}:{port}
  secret: torpor-test-secret
{tls}{auth}{middleware}"""

PROXY = """\
proxy:
  remoteurl: {remote}
"""

REDIRECT_BLOBS = """\
middleware:
  storage:
    - name: redirect
      options:
        baseurl: {baseurl}
"""

TLS = """\
  tls:
    certificate: {cert}
    key: {key}
"""

HTPASSWD_AUTH = """\
auth:
  htpasswd:
    realm: torpor-test
    path: {htpasswd}
"""

TOKEN_AUTH = """\
auth:
  token:
    realm: {realm}
    service: {service}
    issuer: {issuer}
    rootcertbundle: {certs}
"""


def self_signed_certificate(directory: Path, common_name: str = "127.0.0.1") -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1 and localhost, made by openssl."""
    cert, key = directory / "registry-cert.pem", directory / "registry-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
                    "-subj", f"/CN={common_name}",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return cert, key


class Registry:
    def __init__(self, base: Path, name: str, *, users: dict[str, str] | None = None, tls: bool = False,
                 token_auth: dict[str, str] | None = None, delete: bool = True,
                 redirect_blobs: str | None = None, proxy_of: str | None = None,
                 netns: NetNS | None = None, address: str = "127.0.0.1",
                 certificate: tuple[Path, Path] | None = None) -> None:
        """`proxy_of`: a URL; this one is then a pull-through cache of that registry. `netns`:
        it runs there, on every address, and is named by `address`; `certificate`: (cert, key)
        to serve TLS with (its CA is the caller's)."""
        self.dir = base / name
        self.dir.mkdir(parents=True)
        self.storage = self.dir / "storage"
        self.netns = netns
        self.port = 5000 if netns else free_port()   # a new namespace has every port free
        self.host = f"{address}:{self.port}"
        self.ca_file: Path | None = None
        tls_section = auth_section = ""
        if certificate:
            tls_section = TLS.format(cert=certificate[0], key=certificate[1])
        elif tls:
            cert, key = self_signed_certificate(self.dir)
            self.ca_file = cert
            tls_section = TLS.format(cert=cert, key=key)
        if users:
            htpasswd = self.dir / "htpasswd"
            lines = [subprocess.run(["htpasswd", "-Bbn", user, password], check=True, capture_output=True,
                                    text=True).stdout.strip() for user, password in users.items()]
            htpasswd.write_text("\n".join(lines) + "\n")
            auth_section = HTPASSWD_AUTH.format(htpasswd=htpasswd)
        if token_auth:
            auth_section = TOKEN_AUTH.format(**token_auth)
        self.config = self.dir / "config.yml"
        self.config.write_text(CONFIG.format(storage=self.storage, port=self.port, tls=tls_section,
                                             listen="0.0.0.0" if netns else "127.0.0.1",
                                             auth=auth_section, delete=str(delete).lower(),
                                             middleware=(REDIRECT_BLOBS.format(baseurl=redirect_blobs)
                                                         if redirect_blobs else "")
                                             + (PROXY.format(remote=proxy_of) if proxy_of else "")))
        self.log = self.dir / "registry.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Registry:
        with open(self.log, "ab") as log:
            enter = ["nsenter", f"--net={self.netns.path}"] if self.netns else []
            self.proc = subprocess.Popen([*enter, "docker-registry", "serve", str(self.config)],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_for(lambda: self._listening() or self._died(), timeout=20,
                 what=f"docker-registry on {self.host}")
        return self

    def _listening(self) -> bool:
        if self.netns is not None:   # its port is in another namespace: it says when it listens
            return "listening on" in self.log_text()
        return port_open("127.0.0.1", self.port)

    def _died(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {self.log.read_text()[-2000:]}")
        return False

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None

    def blob_data(self, digest: str) -> Path:
        algorithm, hex_part = digest.split(":")
        return self.storage / "docker/registry/v2/blobs" / algorithm / hex_part[:2] / hex_part / "data"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def layer_digests(self, repository: str, tag: str) -> set[str]:
        """The digests of every layer of the image index at repository:tag, asked of it."""
        def get(reference: str) -> dict[str, Any]:
            request = urllib.request.Request(
                f"http://{self.host}/v2/{repository}/manifests/{reference}",
                headers={"Accept": "application/vnd.oci.image.index.v1+json, "
                                   "application/vnd.oci.image.manifest.v1+json"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                document: dict[str, Any] = json.load(answer)
                return document

        return {layer["digest"] for m in get(tag)["manifests"]
                for layer in get(m["digest"])["layers"]}

    def wait_quiet(self, quiet_s: float = 0.3, timeout: float = 10) -> None:
        """Until its log has not grown for `quiet_s` (what it does after answering, e.g. a
        pull-through cache storing a blob, has been logged)."""
        deadline = time.monotonic() + timeout
        size = self.log_mark()
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = self.log_mark()
            if now == size:
                return
            size = now

    def log_mark(self) -> int:
        """Where its log ends now, for `requests_since`."""
        return len(self.log_text())

    def requests_since(self, mark: int) -> list[str]:
        """The requests it answered after `mark`: "GET /v2/...", in order."""
        found = (re.search(r'http\.request\.method=(\w+) .*?http\.request\.uri="([^"]+)"', line)
                 for line in self.log_text()[mark:].splitlines() if "response completed" in line)
        return [f"{m.group(1)} {m.group(2)}" for m in found if m]


def docker_config(directory: Path, auths: dict[str, tuple[str, str]] | None = None,
                  cred_helpers: dict[str, str] | None = None, creds_store: str | None = None) -> Path:
    """A docker config.json in `directory` (use it as DOCKER_CONFIG); returns its path."""
    import base64

    config: dict[str, object] = {}
    if auths:
        config["auths"] = {host: {"auth": base64.b64encode(f"{u}:{p}".encode()).decode()}
                           for host, (u, p) in auths.items()}
    if cred_helpers:
        config["credHelpers"] = cred_helpers
    if creds_store:
        config["credsStore"] = creds_store
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def credential_helper(bin_dir: Path, name: str, secrets: dict[str, tuple[str, str]]) -> Path:
    """A `docker-credential-<name>` script that answers `get` from `secrets` {server: (user, secret)}."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / f"docker-credential-{name}"
    table = json.dumps({server: {"ServerURL": server, "Username": user, "Secret": secret}
                        for server, (user, secret) in secrets.items()})
    script.write_text(f"""#!/usr/bin/env python3
import json, sys
table = json.loads({table!r})
if sys.argv[1:] != ["get"]:
    sys.exit("only get is supported")
server = sys.stdin.read().strip()
if server not in table:
    print("credentials not found in native keychain")
    sys.exit(1)
print(json.dumps(table[server]))
""")
    script.chmod(0o755)
    return script
