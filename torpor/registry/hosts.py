"""Where a registry's API is reached: containerd's host configuration (hosts.toml), as ctr and
nerdctl read it, so torpor pulls through the same mirrors and pull-through caches as the node's
images and pushes where containerd would.

    /etc/containerd/certs.d/<host[:port]>/hosts.toml     (else .../_default/hosts.toml)

    server = "https://registry.example.com"      # the upstream; default https://<host>
    ca = "/etc/ssl/registry-ca.pem"               # or a list; for the server
    [host."http://10.0.0.5:5000"]                  # tried first, in the order written
      capabilities = ["pull", "resolve"]          # default: pull, resolve, push
      ca = ["/etc/ssl/mirror-ca.pem"]
      skip_verify = false
      client = [["/etc/ssl/client.pem", "/etc/ssl/client.key"]]
      override_path = false                       # true: the URL's path replaces /v2
      [host."http://10.0.0.5:5000".header]
        x-custom = "value"

A mirror's requests carry `?ns=<registry>`, as containerd's. `resolve` (a tag to a digest) and
`pull` (by digest) go to the hosts that have them, in order, then the server; `push` to the
first host that may push (the server, unless a host says `push`). A scheme written in the file
is the administrator's choice: plain http is used where it says http://. Nothing here trusts a
mirror: every manifest and blob it serves is checked against its digest, and a tag it resolves
against the node's signature policy, as if the origin had served it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from torpor.errors import ConfigError

DEFAULT_DIR = "/etc/containerd/certs.d"
CAPABILITIES = frozenset({"pull", "resolve", "push"})


@dataclass(frozen=True)
class Endpoint:
    """One host that serves the registry's API."""

    scheme: str                  # "https" or "http"; "" lets torpor probe (no hosts.toml)
    host: str                    # host[:port]
    path: str = "/v2"            # what replaces /v2 in each request's path
    capabilities: frozenset[str] = CAPABILITIES
    ca_files: tuple[Path, ...] = ()
    skip_verify: bool = False
    client_certs: tuple[tuple[Path, Path | None], ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    namespace: str = ""          # ?ns= for a mirror: the registry it stands in for
    source: str = ""             # the file that named it
    insecure: bool = False       # registries.conf's insecure: plain http or TLS unverified
    remap: tuple[str, str] = ("", "")   # registries.conf: a repository prefix and its new name
    mirror: bool = False         # a mirror in registries.conf (no ?ns=)

    def repository(self, name: str) -> str:
        """The repository's name on this host (registries.conf may move it)."""
        old, new = self.remap
        if old and (name == old or name.startswith(old + "/")):
            return (new + name[len(old):]).strip("/")
        if not old and new:
            return f"{new}/{name}"
        return name

    @property
    def is_mirror(self) -> bool:
        return bool(self.namespace) or self.mirror

    def describe(self) -> str:
        where = f"{self.scheme}://{self.host}" if self.scheme else self.host
        return f"{where} (mirror, {self.source})" if self.is_mirror else where


def endpoints(registry: str, api_host: str, hosts_dir: Path | None,
              registries_conf: Path | None = None, repository: str = "") -> list[Endpoint]:
    """The hosts to try for `registry`, mirrors first, the server last: from its hosts.toml,
    else from registries.conf (Podman's, for `repository`), else the registry's own API host
    alone (scheme probed, options' CA and --insecure)."""
    path = _hosts_file(registry, hosts_dir)
    if path is None:
        from_podman = _from_registries_conf(registries_conf, registry, repository)
        return from_podman or [Endpoint("", api_host)]
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}",
                          hint="containerd's hosts.toml format: "
                               "https://github.com/containerd/containerd/blob/main/docs/hosts.md"
                          ) from None
    where = str(path)
    server_url = document.get("server", f"https://{api_host}")
    if not isinstance(server_url, str):
        raise ConfigError(f"{where}: server must be a URL string")
    hosts = document.get("host", {})
    if not isinstance(hosts, dict):
        raise ConfigError(f"{where}: [host.\"URL\"] tables expected")
    out = [_endpoint(url, table, where, namespace=registry)
           for url, table in hosts.items()]
    out.append(_endpoint(server_url, document, where, namespace="", server=True))
    return out


def for_capability(found: list[Endpoint], capability: str) -> list[Endpoint]:
    return [e for e in found if capability in e.capabilities]


def _hosts_file(registry: str, hosts_dir: Path | None) -> Path | None:
    if hosts_dir is None:
        return None
    name = "docker.io" if registry in ("index.docker.io", "registry-1.docker.io") else registry
    for directory in (name, "_default"):
        candidate = hosts_dir / directory / "hosts.toml"
        if candidate.is_file():
            return candidate
    return None


def _endpoint(url: str, table: Any, where: str, namespace: str, server: bool = False) -> Endpoint:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [host.\"{url}\"] must be a table")
    parts = urlsplit(url if "://" in url else f"https://{url}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{where}: {url!r} is not an http:// or https:// URL")
    capabilities = table.get("capabilities", sorted(CAPABILITIES))
    if not isinstance(capabilities, list) or not set(capabilities) <= CAPABILITIES:
        raise ConfigError(f"{where}: capabilities of {url} must be a list of "
                          f"{', '.join(sorted(CAPABILITIES))}")
    override = table.get("override_path", False)
    path = parts.path.rstrip("/")
    path = path if override else f"{path}/v2"
    headers = table.get("header", {})
    if not isinstance(headers, dict):
        raise ConfigError(f"{where}: the header table of {url} must map names to strings")
    return Endpoint(
        scheme=parts.scheme, host=parts.netloc, path=path,
        capabilities=frozenset(capabilities), ca_files=tuple(Path(p) for p in _paths(
            table.get("ca", []), where, url)),
        skip_verify=bool(table.get("skip_verify", False)),
        client_certs=_client_certs(table.get("client", []), where, url),
        headers={str(k): v if isinstance(v, str) else ", ".join(map(str, v))
                 for k, v in headers.items()},
        namespace="" if server else namespace, source=where)


def _paths(value: object, where: str, url: str) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(p, str) for p in items):
        raise ConfigError(f"{where}: ca of {url} must be a path or a list of paths")
    return items


def _client_certs(value: object, where: str, url: str) -> tuple[tuple[Path, Path | None], ...]:
    """`client = "cert.pem"`, `["cert.pem", "key.pem"]` (one pair) or a list of those."""
    if isinstance(value, str):
        return ((Path(value), None),)
    if not isinstance(value, list):
        raise ConfigError(f"{where}: client of {url} must be a path or a list")
    if len(value) == 2 and all(isinstance(p, str) for p in value):
        return ((Path(value[0]), Path(value[1])),)
    out: list[tuple[Path, Path | None]] = []
    for item in value:
        if isinstance(item, str):
            out.append((Path(item), None))
        elif isinstance(item, list) and 1 <= len(item) <= 2 and all(isinstance(p, str)
                                                                    for p in item):
            out.append((Path(item[0]), Path(item[1]) if len(item) == 2 else None))
        else:
            raise ConfigError(f"{where}: client of {url}: a path or a [cert, key] pair")
    return tuple(out)


def _from_registries_conf(path: Path | None, registry: str, repository: str
                          ) -> list[Endpoint] | None:
    """containers-registries.conf(5), version 2: the `[[registry]]` whose prefix matches
    `registry/repository` longest; its mirrors (pull-from-mirror: all, digest-only,
    tag-only), then its location. None when the file or a matching table is absent."""
    if path is None:
        return None
    drop_ins = path.with_name(path.name + ".d")
    files = [path, *sorted(drop_ins.glob("*.conf"))] if drop_ins.is_dir() else [path]
    by_prefix: dict[str, tuple[dict[str, Any], str]] = {}   # a later file's table replaces
    for file in files:
        if not file.is_file():
            continue
        try:
            document = tomllib.loads(file.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read {file}: {e}",
                              hint="see containers-registries.conf(5)") from None
        tables = document.get("registry", [])
        for table in tables if isinstance(tables, list) else []:
            if isinstance(table, dict):
                prefix = str(table.get("prefix") or table.get("location") or "")
                by_prefix[prefix] = (table, str(file))
    name = f"{registry}/{repository}" if repository else registry
    best: dict[str, Any] | None = None
    best_prefix, where = "", str(path)
    for prefix, (table, source) in by_prefix.items():
        if prefix.startswith("*."):   # *.example.com: any host under it
            host = registry.split(":")[0]
            matches = host.endswith(prefix[1:])
        else:
            matches = bool(prefix) and (name == prefix or name.startswith(prefix + "/")
                                        or name.startswith(prefix + ":")
                                        or name.startswith(prefix + "@"))
        if matches and len(prefix) > len(best_prefix):
            best, best_prefix, where = table, prefix, source
    if best is None:
        return None
    if best.get("blocked"):
        raise ConfigError(f"{where}: {best_prefix} is blocked", hint="blocked = true in its "
                          "[[registry]] table")
    old = best_prefix.partition("/")[2] if not best_prefix.startswith("*.") else ""
    out = []
    for mirror in best.get("mirror", []) or []:
        if not isinstance(mirror, dict) or not isinstance(mirror.get("location"), str):
            raise ConfigError(f"{where}: a [[registry.mirror]] of {best_prefix} has no location")
        which = mirror.get("pull-from-mirror", best.get("pull-from-mirror", "all"))
        capabilities = {"all": {"pull", "resolve"}, "digest-only": {"pull"},
                        "tag-only": {"resolve"}}.get(str(which))
        if capabilities is None:
            raise ConfigError(f"{where}: pull-from-mirror = {which!r}: all, digest-only or "
                              "tag-only")
        out.append(_conf_endpoint(mirror["location"], old, frozenset(capabilities),
                                  bool(mirror.get("insecure", False)), where, mirror=True))
    location = best.get("location") or best_prefix
    if best_prefix.startswith("*."):
        location = registry if not best.get("location") else location
    out.append(_conf_endpoint(str(location), old, CAPABILITIES,
                              bool(best.get("insecure", False)), where))
    return out


def _conf_endpoint(location: str, old: str, capabilities: frozenset[str], insecure: bool,
                   where: str, mirror: bool = False) -> Endpoint:
    host, _, path = location.partition("/")
    if not host:
        raise ConfigError(f"{where}: location {location!r} has no host")
    return Endpoint(scheme="", host=host, capabilities=capabilities, insecure=insecure,
                    remap=(old, path), mirror=mirror, source=where)
