"""Image references: `registry.example/team/web1:ckpt-1`, `host:5000/repo@sha256:...`, `redis:7`.

The grammar is distribution's (github.com/distribution/reference): the first path component
names a registry when it holds a `.` or a `:`, or is `localhost`; otherwise the registry is
Docker Hub (`docker.io`), whose single-component names live under `library/` and whose API is
served from `registry-1.docker.io`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from torpor.errors import ConfigError

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}")
_HOST = re.compile(r"(?:\[[0-9a-fA-F:.]+\]|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
                   r"(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*)(?::[0-9]+)?")


@dataclass(frozen=True)
class Reference:
    """A parsed reference. `registry` is as the user wrote it (`docker.io` for Hub)."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def api_host(self) -> str:
        """host[:port] that serves the registry's HTTP API."""
        return DOCKER_HUB_API if self.registry in DOCKER_HUB_ALIASES else self.registry

    @property
    def reference(self) -> str:
        """What goes after /manifests/: the digest if there is one, else the tag, else latest."""
        return self.digest or self.tag or "latest"

    @property
    def hostname(self) -> str:
        host = self.api_host
        if host.startswith("["):
            return host[1:host.index("]")]
        return host.rsplit(":", 1)[0] if ":" in host else host

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.hostname)

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.registry, self.repository, self.tag, digest)

    def in_repository(self, repository: str) -> Reference:
        return Reference(self.registry, repository)

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def is_loopback_host(hostname: str) -> bool:
    if hostname == "localhost" or hostname.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def parse_reference(text: str) -> Reference:
    """Parse `text`; raises ConfigError saying what is wrong with it."""
    remainder, digest = text, None
    if "@" in remainder:
        remainder, digest = remainder.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise _invalid(text, f"{digest!r} is not a digest (algorithm:hex)")
    registry, path = _split_registry(remainder)
    tag = None
    last_slash = path.rfind("/")
    if ":" in path[last_slash + 1:]:
        path, tag = path.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise _invalid(text, f"{tag!r} is not a valid tag")
    if not path:
        raise _invalid(text, "the repository name is empty")
    for component in path.split("/"):
        if not _COMPONENT.fullmatch(component):
            raise _invalid(text, f"{component!r} is not a valid repository path component "
                                 "(lowercase letters, digits and separators . _ __ -)")
    if registry in DOCKER_HUB_ALIASES:
        registry = DOCKER_HUB
        if "/" not in path:
            path = f"library/{path}"
    if len(path) > 255:
        raise _invalid(text, "the repository name is longer than 255 characters")
    return Reference(registry, path, tag, digest)


def _split_registry(text: str) -> tuple[str, str]:
    first, sep, rest = text.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        if not _HOST.fullmatch(first):
            raise _invalid(text, f"{first!r} is not a valid registry host[:port]")
        return first, rest
    return DOCKER_HUB, text


def _invalid(text: str, why: str) -> ConfigError:
    return ConfigError(f"invalid image reference {text!r}: {why}",
                       hint="expected [registry[:port]/]repository[:tag][@sha256:digest]")
