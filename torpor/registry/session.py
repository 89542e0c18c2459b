"""Requests to one registry: authentication, retries with backoff, redirects, status checks.

`request` sends a request whose body is bytes or nothing; `send_file` streams a body from a file
and does not retry on its own (blob uploads resume instead, see blob_upload). Both answer one
401 by renewing the credentials and sending again; an unexpected status becomes the error of
http_errors. Redirects are followed for GET and HEAD, without credentials when they leave the
registry's host (blob storage behind a CDN). A 401 is the registry's challenge only when the
registry's host sent it: one from a host it redirected to is an AuthError, its realm never asked.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from urllib.parse import urlencode, urljoin, urlsplit

from torpor.errors import AuthError, ConfigError, RegistryError
from torpor.registry import hosts, http_errors
from torpor.registry.auth import Authenticator
from torpor.registry.credentials import Credentials, find_credentials
from torpor.registry.hosts import Endpoint
from torpor.registry.options import RegistryOptions
from torpor.registry.reference import Reference
from torpor.registry.response import Response
from torpor.registry.transport import ChunkObserver, ReadableFile, Transport, backoff_delays, sleep

REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5
ERROR_BODY_LIMIT = 64 * 1024


@dataclass
class FileBody:
    """`length` bytes from `file`'s current position; `observe` sees each read before it is sent."""

    file: ReadableFile
    length: int
    observe: ChunkObserver | None = None


class RegistrySession:
    """Everything that talks to one registry host, shared by the threads of a push or pull."""

    def __init__(self, registry: str, host: str, options: RegistryOptions,
                 credentials: Credentials | None, endpoint: Endpoint | None = None) -> None:
        self.registry, self.host = registry, host
        self.endpoint = endpoint or Endpoint("", host)
        if endpoint is not None:   # what the node's hosts.toml says of this host
            options = replace(options, ca_files=(*options.ca_files, *endpoint.ca_files),
                              client_certs=endpoint.client_certs,
                              skip_verify=options.skip_verify or endpoint.skip_verify,
                              insecure=options.insecure or endpoint.insecure)
        self.options = options
        given = {endpoint.host: endpoint.scheme} if endpoint and endpoint.scheme else {}
        self.transport = Transport(registry, options, given)
        self.auth = Authenticator(registry, self.transport, credentials)

    @classmethod
    def for_reference(cls, ref: Reference, options: RegistryOptions,
                      capability: str = "push") -> RegistrySession:
        """A session for the reference's registry, with the credentials options or docker give,
        on the first host the node's hosts.toml gives for `capability` (the registry itself
        when there is none)."""
        return cls.candidates(ref, options, capability)[0]

    @classmethod
    def candidates(cls, ref: Reference, options: RegistryOptions,
                   capability: str) -> list[RegistrySession]:
        """One session per host that may serve `capability` ("pull", "resolve", "push"), in the
        order containerd tries them: mirrors first, the registry's server last."""
        found = hosts.endpoints(ref.registry, ref.api_host, options.hosts_dir,
                                options.registries_conf, ref.repository)
        able = hosts.for_capability(found, capability)
        if not able:
            raise ConfigError(f"{found[-1].source}: no host of {ref.registry} may {capability}",
                              hint=f'add "{capability}" to a host\'s capabilities')
        out = []
        for endpoint in able:
            if options.username:
                credentials: Credentials | None = Credentials(
                    options.username, options.password or "", source="--username")
            else:   # a mirror's own credentials; the server's are the registry's
                own = endpoint.host if endpoint.is_mirror else ref.registry
                credentials = find_credentials(own, options.docker_config)
            given = None if endpoint == hosts.Endpoint("", ref.api_host) else endpoint
            out.append(cls(ref.registry, endpoint.host, options, credentials, given))
        return out

    def repository(self, name: str) -> str:
        """The repository's name on this host (Podman's registries.conf may move it)."""
        return self.endpoint.repository(name)

    def url(self, path: str) -> str:
        """The URL of an API path ("/v2/..."): on this host, under the path its hosts.toml
        gives, with `ns=` for a mirror (as containerd sends it)."""
        endpoint = self.endpoint
        if path.startswith("/v2"):
            path = endpoint.path + path[3:]
        if endpoint.namespace:
            path += ("&" if "?" in path else "?") + urlencode({"ns": endpoint.namespace})
        return self.transport.base_url(self.host) + path

    def request(self, method: str, url: str, *, scope: str, what: str, ok: Collection[int],
                headers: dict[str, str] | None = None, body: bytes | None = None,
                retry: bool = True) -> Response:
        """Send and check the status; transient failures are retried with backoff."""
        delays = backoff_delays(self.options) if retry else iter(())
        while True:
            try:
                return self._authorised(method, url, scope, what, ok, headers or {}, lambda: body, None)
            except http_errors.TransientError:
                delay = next(delays, None)
                if delay is None:
                    raise
                sleep(delay)

    def send_file(self, method: str, url: str, *, scope: str, what: str, ok: Collection[int],
                  headers: dict[str, str], open_body: Callable[[], FileBody]) -> Response:
        """Stream a file body once (twice if the first answer is a 401); no retries."""
        return self._authorised(method, url, scope, what, ok, headers, None, open_body)

    def close(self) -> None:
        self.transport.close()

    def _authorised(self, method: str, url: str, scope: str, what: str, ok: Collection[int],
                    headers: dict[str, str], body: Callable[[], bytes | None] | None,
                    open_body: Callable[[], FileBody] | None) -> Response:
        sent = self.auth.header(scope)
        for attempt in range(2):
            response = self._follow(method, url, what, headers, sent, body, open_body)
            if response.status == 401 and urlsplit(response.url).netloc != self.host:
                response.discard()
                raise self._foreign_challenge(response.url, what)
            if response.status != 401 or attempt == 1:
                break
            challenges = response.headers.get_all("WWW-Authenticate") or []
            response.discard()
            sent = self.auth.renew(challenges, scope, sent)
        if response.status == 401 and sent is not None and sent.startswith("Basic "):
            response.discard()
            raise self.auth.rejected()
        if response.status not in ok:
            raise self._error(response)
        return response

    def _follow(self, method: str, url: str, what: str, headers: dict[str, str], authorization: str | None,
                body: Callable[[], bytes | None] | None,
                open_body: Callable[[], FileBody] | None) -> Response:
        for _ in range(MAX_REDIRECTS + 1):
            own_host = urlsplit(url).netloc == self.host
            all_headers = {**self.endpoint.headers, **headers} if own_host else dict(headers)
            if authorization and own_host:
                all_headers["Authorization"] = authorization
            if open_body is not None:
                source = open_body()
                response = self.transport.open(method, url, all_headers, what, body_file=source.file,
                                               body_length=source.length, observe=source.observe)
            else:
                response = self.transport.open(method, url, all_headers, what,
                                               body=body() if body else None)
            location = response.header("Location")
            if response.status not in REDIRECTS or method not in ("GET", "HEAD") or not location:
                return response
            response.discard()
            url = urljoin(url, location)
        raise http_errors.from_response(response.status, b"", f"{what} (too many redirects)", self.registry)

    def _foreign_challenge(self, url: str, what: str) -> AuthError:
        """A 401 from a host the registry redirected to is not the registry's challenge: its
        realm is nobody torpor knows, and the registry's credentials go to the registry (and
        the realm the registry names) alone."""
        host = urlsplit(url).netloc
        return AuthError(f"{host}, where registry {self.registry} redirected {what}, answered 401; "
                         f"torpor sends the registry's credentials to the registry alone",
                         status=401, hint="its blob storage refused the request: an expired signed URL "
                         "or a misconfigured registry; retry, or ask its operator")

    def _error(self, response: Response) -> RegistryError:
        try:
            body = response.read_limited(ERROR_BODY_LIMIT)
        except RegistryError:
            body = b""
        headers = {name: value for name, value in response.headers.items()}
        return http_errors.from_response(response.status, body, response.what, self.registry, headers)
