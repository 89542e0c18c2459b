"""Registry authentication: anonymous, HTTP Basic, and bearer tokens from the registry's token server.

The registry says what it wants in `WWW-Authenticate` on a 401. Basic: the credentials go on
every request. Bearer (`realm`, `service`, `scope`): a token is fetched from the realm (Basic
credentials, an identity token as an OAuth2 refresh token, or anonymously when there are none)
for the scopes asked for, cached per scope until it expires and sent before any 401 once the
realm is known. The session retries a request once after a 401; a second 401 is an AuthError.
No secret is ever logged, put in a message, or sent over plain http to a non-loopback host.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlencode

from torpor.errors import AuthError
from torpor.registry import http_errors
from torpor.registry.credentials import Credentials
from torpor.registry.transport import Transport

TOKEN_LIMIT = 1 << 20
MIN_TOKEN_LIFETIME_S = 60
EXPIRY_MARGIN_S = 10
_PARAM = re.compile(r'\s*([A-Za-z0-9_.-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^,\s]*)\s*,?')
_SCHEME = re.compile(r"\s*([A-Za-z][A-Za-z0-9_.-]*)(?=\s|$)")


@dataclass(frozen=True)
class Challenge:
    scheme: str  # lowercase: "basic", "bearer"
    params: dict[str, str]


def parse_challenges(headers: list[str]) -> list[Challenge]:
    """Every challenge in the WWW-Authenticate headers of a 401 (several may share a header)."""
    found: list[Challenge] = []
    for header in headers:
        rest = header
        while rest.strip():
            scheme = _SCHEME.match(rest)
            if not scheme:
                break
            params: dict[str, str] = {}
            rest = rest[scheme.end():]
            while (param := _PARAM.match(rest)) is not None:
                value = param.group(2)
                if value.startswith('"'):
                    value = re.sub(r"\\(.)", r"\1", value[1:-1])
                params[param.group(1).lower()] = value
                rest = rest[param.end():]
            found.append(Challenge(scheme.group(1).lower(), params))
    return found


class Authenticator:
    """The Authorization header for each request to one registry."""

    def __init__(self, registry: str, transport: Transport, credentials: Credentials | None) -> None:
        self.registry, self._transport, self._credentials = registry, transport, credentials
        self._lock = threading.Lock()
        self._basic = False
        self._realm: tuple[str, str] | None = None  # (realm URL, service)
        self._tokens: dict[str, tuple[str, float]] = {}  # scope -> (token, expiry on time.monotonic)

    def header(self, scope: str) -> str | None:
        """What to send before any challenge: Basic once asked for, a cached or fresh token once
        the realm is known, else nothing."""
        with self._lock:
            if self._basic and self._credentials and self._credentials.username:
                return self._credentials.basic_header()
            if self._realm is None:
                return None
            token = self._tokens.get(scope)
            if token and token[1] > time.monotonic():
                return f"Bearer {token[0]}"
            return self._fetch_token(scope, scope)

    def renew(self, www_authenticate: list[str], scope: str, sent: str | None) -> str:
        """The header to retry a request with after a 401 that carried `www_authenticate`."""
        challenges = {c.scheme: c for c in parse_challenges(www_authenticate)}
        with self._lock:
            if bearer := challenges.get("bearer"):
                realm = bearer.params.get("realm")
                if not realm:
                    raise AuthError(f"registry {self.registry} asked for a bearer token without a realm")
                self._realm = (realm, bearer.params.get("service", ""))
                cached = self._tokens.get(scope)
                if cached and f"Bearer {cached[0]}" != sent and cached[1] > time.monotonic():
                    return f"Bearer {cached[0]}"  # another thread has just renewed it
                self._tokens.pop(scope, None)
                return self._fetch_token(scope, merge_scopes(scope, bearer.params.get("scope", "")))
            if "basic" in challenges:
                if sent is not None and sent.startswith("Basic "):
                    raise self.rejected()
                creds = self._credentials
                if creds is None or not creds.username or creds.identity_token:
                    raise AuthError(f"registry {self.registry} requires a login",
                                    hint=http_errors.LOGIN_HINT)
                self._basic = True
                return creds.basic_header()
        raise AuthError(f"registry {self.registry} answered 401 without a challenge torpor supports",
                        hint=http_errors.LOGIN_HINT)

    def rejected(self) -> AuthError:
        """The error for credentials the registry or its token server refused."""
        creds = self._credentials
        who = f"user {creds.username!r}" if creds and creds.username else "the identity token"
        source = f" (from {creds.source})" if creds and creds.source else ""
        return AuthError(f"registry {self.registry} rejected the credentials of {who}{source}",
                         status=401, hint=http_errors.LOGIN_HINT)

    def _fetch_token(self, cache_key: str, scope: str) -> str:
        assert self._realm is not None
        realm, service = self._realm
        query = [("service", service)] if service else []
        query += [("scope", s) for s in scope.split()]
        creds = self._credentials
        headers = {"Accept": "application/json"}
        body = None
        method, url = "GET", realm + ("&" if "?" in realm else "?") + urlencode(query)
        if creds and creds.identity_token:
            method, url = "POST", realm
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            body = urlencode([*query, ("grant_type", "refresh_token"), ("client_id", "torpor"),
                              ("refresh_token", creds.identity_token)]).encode()
        elif creds and creds.username:
            headers["Authorization"] = creds.basic_header()
        response = self._transport.open(method, url, headers, f"a token request to {realm}", body=body)
        if response.status in (401, 403):
            response.discard()
            if creds is None:
                raise AuthError(f"registry {self.registry} refused an anonymous token for {scope}",
                                status=response.status, hint=http_errors.LOGIN_HINT)
            raise self.rejected()
        document = response.read_limited(TOKEN_LIMIT)
        if response.status != 200:
            raise http_errors.from_response(response.status, document, f"a token request to {realm}",
                                            self.registry)
        token, lifetime = _token_from(document, realm)
        self._tokens[cache_key] = (token, time.monotonic() + max(lifetime, MIN_TOKEN_LIFETIME_S)
                                   - EXPIRY_MARGIN_S)
        return f"Bearer {token}"


def merge_scopes(*scopes: str) -> str:
    """One scope string naming each resource once, with the union of its actions:
    "repository:a:pull" + "repository:a:pull,push" -> "repository:a:pull,push"."""
    actions: dict[str, set[str]] = {}
    for scope in " ".join(scopes).split():
        resource, _, wanted = scope.rpartition(":")
        actions.setdefault(resource or scope, set()).update(a for a in wanted.split(",") if a)
    return " ".join(f"{resource}:{','.join(sorted(acts))}" for resource, acts in sorted(actions.items()))


def _token_from(document: bytes, realm: str) -> tuple[str, float]:
    try:
        answer = json.loads(document)
        token = answer.get("token") or answer.get("access_token")
        lifetime = float(answer.get("expires_in") or MIN_TOKEN_LIFETIME_S)
    except (ValueError, AttributeError, TypeError):
        token = None
    if not isinstance(token, str) or not token:
        raise AuthError(f"the token server {realm} answered without a token")
    return token, lifetime
