"""An HTTP answer from the registry: status, headers, and a body read on demand.

The body is read to a size limit (manifests, tokens, error documents) or streamed in reads into
one reused 1 MiB buffer (blobs). Closing it gives the connection back to the pool when the body
was read to its end, and closes it otherwise. Read failures become RegistryError.
"""

from __future__ import annotations

import http.client
from collections.abc import Callable, Iterator

from torpor.errors import RegistryError
from torpor.registry import http_errors

BUFFER_SIZE = 1 << 20


class Response:
    """An HTTP answer whose body is read on demand; `close()` returns the connection to the pool."""

    def __init__(self, answer: http.client.HTTPResponse, url: str, what: str,
                 release: Callable[[bool], None],
                 network_error: Callable[[BaseException, str], RegistryError]) -> None:
        self._answer, self._release, self._network_error = answer, release, network_error
        self._held = True  # the connection is ours until released
        self.status, self.url, self.what = answer.status, url, what
        self.headers = answer.headers

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def read_limited(self, limit: int) -> bytes:
        """The whole body, or RegistryError when it is longer than `limit` bytes."""
        declared = self.header("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            self._drop()
            raise _too_large(self.what, int(declared), limit)
        try:
            data = self._answer.read(limit + 1)
        except (*http_errors.FOREIGN,) as e:
            raise self._failed(e) from None
        if len(data) > limit:
            self._drop()
            raise _too_large(self.what, len(data), limit)
        self.close()
        return data

    def readinto(self, buffer: memoryview) -> int:
        try:
            return self._answer.readinto(buffer)
        except (*http_errors.FOREIGN,) as e:
            raise self._failed(e) from None

    def iter_chunks(self) -> Iterator[memoryview]:
        """The body in reads of up to BUFFER_SIZE into one reused buffer (valid until the next)."""
        buffer = memoryview(bytearray(BUFFER_SIZE))
        while n := self.readinto(buffer):
            yield buffer[:n]

    def discard(self) -> None:
        """Read and drop a small body (an error document) so the connection can be reused."""
        try:
            self._answer.read(64 * 1024)
        except (*http_errors.FOREIGN,):
            self._drop()
        self.close()

    def close(self) -> None:
        """Give the connection back: to the pool when the body was read to its end, else closed."""
        if not self._held:
            return
        if not self._answer.isclosed() and self._answer.length == 0:
            self._answer.read()  # a HEAD or empty answer: nothing to read, marks it complete
        # closed by its end, not by a drop that left declared bytes unread
        if self._answer.isclosed() and not self._answer.will_close and not self._answer.length:
            self._held = False
            self._release(True)
        else:
            self._drop()

    def _drop(self) -> None:
        self._answer.close()
        if self._held:
            self._held = False
            self._release(False)

    def _failed(self, exc: BaseException) -> RegistryError:
        self._drop()
        return self._network_error(exc, self.what)


def _too_large(what: str, size: int, limit: int) -> RegistryError:
    return RegistryError(f"{what} is larger than the limit of {limit} bytes ({size} bytes or more)",
                         hint="registries accept manifests of at most 4 MiB; this one is not a "
                              "manifest torpor or the registry wrote")
