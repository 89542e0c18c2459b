"""The one place where HTTP answers and network failures become RegistryError or AuthError.

Every other module of the registry client calls `from_response` for an unexpected status and
`from_network` for a foreign exception (OSError and its ssl/socket subclasses, http.client's
HTTPException); `FOREIGN` lists what may cross this boundary, and a test maps each of them.
Messages say which registry, which blob or manifest, the status, the registry's own error code
and message, and what to do. They never hold credentials, tokens or content.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from collections.abc import Mapping

from torpor.errors import AuthError, RegistryError

FOREIGN: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
LOGIN_HINT = "log in with docker login, or pass --username and --password"

_CODE_HINTS = {
    "UNAUTHORIZED": LOGIN_HINT,
    "DENIED": "the account may not have the rights this needs on the repository (push needs pull,push)",
    "NAME_UNKNOWN": "check the repository name",
    "NAME_INVALID": "repository names are lowercase letters, digits and separators . _ __ -",
    "MANIFEST_UNKNOWN": "check the tag or digest",
    "BLOB_UNKNOWN": "the registry does not hold this blob; push the checkpoint again",
    "MANIFEST_BLOB_UNKNOWN": "a blob the manifest names is missing in the repository",
    "MANIFEST_INVALID": "the registry refused the manifest; some registries allow-list media types",
    "UNSUPPORTED": "the registry does not support this operation or media type",
    "DIGEST_INVALID": "the content was corrupted on the way or changed while uploading; retry",
    "SIZE_INVALID": "the content was corrupted on the way or changed while uploading; retry",
    "BLOB_UPLOAD_INVALID": "the upload session is no longer valid; retry",
    "BLOB_UPLOAD_UNKNOWN": "the upload session expired or was cancelled; retry",
    "TOOMANYREQUESTS": "the registry rate-limits this client; wait and retry",
}


class TransientError(RegistryError):
    """A drop, a reset, a timeout, 429 or a 5xx: worth another attempt. Callers see a RegistryError."""


def registry_error_codes(body: bytes) -> list[tuple[str, str]]:
    """[(code, message)] from a distribution-spec error body; [] when it is not one."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return []
    errors = document.get("errors") if isinstance(document, dict) else None
    found = []
    for entry in errors if isinstance(errors, list) else []:
        if isinstance(entry, dict):
            message = str(entry.get("message", ""))[:300]
            detail = entry.get("detail")
            if isinstance(detail, str) and detail and len(detail) <= 200:
                message = f"{message}: {detail}" if message else detail
            found.append((str(entry.get("code", "")), message))
    return found


def from_response(status: int, body: bytes, what: str, registry: str,
                  headers: Mapping[str, str] | None = None) -> RegistryError:
    """The error for an HTTP answer that `what` (e.g. "GET manifest repo:tag") did not expect."""
    codes = registry_error_codes(body)
    said = "; ".join(f"{code}: {message}" if message else code for code, message in codes)
    message = f"registry {registry} answered {status} to {what}" + (f" ({said})" if said else "")
    hint = next((_CODE_HINTS[code] for code, _ in codes if code in _CODE_HINTS), None)
    kind = TransientError if status in RETRYABLE_STATUS else RegistryError
    if status == 401:
        return AuthError(message, status=status, hint=LOGIN_HINT)
    if status == 403:
        return AuthError(message, status=status, hint=hint or _CODE_HINTS["DENIED"])
    if status == 413:
        hint = "the registry's size limit is lower than this manifest or blob"
    elif status == 429:
        retry_after = (headers or {}).get("Retry-After")
        hint = _CODE_HINTS["TOOMANYREQUESTS"] + (f" (after {retry_after}s)" if retry_after else "")
    elif status >= 500 and hint is None:
        hint = "the registry failed; retry later or check its logs"
    elif status == 404 and hint is None:
        hint = "check the registry address, repository and tag"
    return kind(message, status=status, hint=hint)


def from_network(exc: BaseException, registry: str, what: str,
                 timeout_s: float | None = None) -> RegistryError:
    """The error for a foreign exception raised while talking to `registry`."""
    error = _network_error(exc, f"registry {registry}", what, timeout_s)
    if is_retryable(exc):
        return TransientError(error.message, hint=error.hint)
    return error


def _network_error(exc: BaseException, where: str, what: str, timeout_s: float | None) -> RegistryError:
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or str(exc)
        return RegistryError(f"the TLS certificate of {where} could not be verified: {reason}",
                             hint="pass --ca-file with the CA certificate that signed it "
                                  "(or --insecure for a test registry)")
    if isinstance(exc, ssl.SSLError):
        return RegistryError(f"TLS with {where} failed during {what}: {getattr(exc, 'reason', None) or exc}",
                             hint="check that the registry speaks HTTPS on this port")
    if isinstance(exc, ConnectionRefusedError):
        return RegistryError(f"nothing is listening at {where} (connection refused)",
                             hint="check the registry's host and port")
    if isinstance(exc, socket.gaierror):
        return RegistryError(f"cannot resolve the host of {where}: {exc.strerror}",
                             hint="check the registry's host name and DNS")
    if isinstance(exc, TimeoutError):
        limit = f" within {timeout_s:g}s" if timeout_s else ""
        return RegistryError(f"{where} did not answer{limit} during {what}",
                             hint="check the network, or raise the timeout")
    if isinstance(exc, ConnectionError | http.client.IncompleteRead | http.client.RemoteDisconnected):
        return RegistryError(f"the connection to {where} dropped during {what}",
                             hint="retry; check proxies and the registry's logs")
    if isinstance(exc, http.client.HTTPException):
        return RegistryError(f"{where} sent an invalid HTTP answer to {what}: {type(exc).__name__}",
                             hint="check that the address is an OCI registry")
    if isinstance(exc, OSError):
        return RegistryError(f"network error talking to {where} during {what}: "
                             f"{exc.strerror or type(exc).__name__}")
    raise TypeError(f"{type(exc).__name__} is not a network error") from exc


def is_retryable(exc: BaseException) -> bool:
    """Whether a foreign exception is transient: a drop, a reset or a timeout (not TLS trust)."""
    if isinstance(exc, ssl.SSLCertVerificationError | ConnectionRefusedError | socket.gaierror):
        return False
    return isinstance(exc, ConnectionError | TimeoutError | http.client.IncompleteRead
                      | http.client.RemoteDisconnected | http.client.BadStatusLine)
