"""Upload one blob from a file: skip it if present, mount it from another repository, or stream it.

Blobs up to `chunk_size` go in one streamed `PUT ?digest=` after the POST; a drop starts a new
upload session and sends them again. Larger blobs go in `PATCH` chunks (`Content-Range`, at
least the registry's `OCI-Chunk-Min-Length`), and a drop resumes: GET the upload's status, read
the registry's offset from `Range`, seek there and continue. A registry that no longer knows
the session (distribution 2.8 refuses a session whose dropped chunk it half-wrote) gets a new
one, from byte 0. The sha256 is computed from the bytes as they are sent; for chunked uploads the
final `PUT` is sent only when it matches, so a corrupted layout blob never reaches the registry.

A blob this process has just written, its digest computed from the bytes it wrote (a
checkpoint's packs and layers, uploaded as they are built), is sent without hashing it again
(a pass of sha256 over everything a checkpoint pushes): the registry checks the digest when
the upload completes (distribution answers DIGEST_INVALID, the error the OCI distribution
spec has for it), and every pull checks it again. Should the registry refuse it, the file
is hashed then, and a file that no longer matches is named as the cause. The cost of the
trade: only a registry that checks nothing would store a blob changed on disk between its write
and its upload, and every pull would refuse it.
"""

from __future__ import annotations

import enum
import io
import os
from collections.abc import Callable
from pathlib import Path

from torpor.errors import DigestMismatch, ImageError, RegistryError
from torpor.formats.digests import Hasher, new_hasher, sha256_file, verify_hasher
from torpor.formats.oci import Descriptor
from torpor.registry.client import RepositoryClient, UploadStart, range_end
from torpor.registry.http_errors import TransientError
from torpor.registry.response import BUFFER_SIZE
from torpor.registry.session import FileBody
from torpor.registry.transport import backoff_delays, sleep


class Outcome(enum.Enum):
    EXISTED = "existed"
    MOUNTED = "mounted"
    UPLOADED = "uploaded"


def push_blob(repo: RepositoryClient, path: Path, blob: Descriptor, mount_from: list[str],
              report: Callable[[int], None], *, written_here: bool = False) -> Outcome:
    """Make `blob` (the content of `path`) exist in `repo`. `written_here`: this process wrote
    `path` and computed `blob.digest` from the bytes it wrote; they are not hashed again."""
    if repo.blob_exists(blob.digest, repo.push_scope):
        report(blob.size)
        return Outcome.EXISTED
    start = None
    for i, source in enumerate(mount_from):
        start = repo.start_upload(blob.digest, source)
        if start.mounted:
            report(blob.size)
            return Outcome.MOUNTED
        if i < len(mount_from) - 1:  # refused: the answer is an upload session; keep the last one
            repo.cancel_upload(start.location)
    _upload(repo, path, blob, start or repo.start_upload(), report, written_here)
    return Outcome.UPLOADED


def _upload(repo: RepositoryClient, path: Path, blob: Descriptor, start: UploadStart,
            report: Callable[[int], None], written_here: bool) -> None:
    try:
        file = open(path, "rb", buffering=0)
    except FileNotFoundError:
        raise ImageError(f"blob {blob.digest} is missing from the layout ({path})") from None
    with file:
        size = os.fstat(file.fileno()).st_size
        if size != blob.size:
            raise ImageError(f"blob {blob.digest} in the layout is {size} bytes, its descriptor says "
                             f"{blob.size}", hint="the layout is damaged; write it again")
        try:
            _Uploader(repo, file, blob, report, rehash=not written_here).run(start)
        except RegistryError:
            if written_here:   # unhashed so far: a file changed since it was written says so
                _check_written(path, blob)
            raise


def _check_written(path: Path, blob: Descriptor) -> None:
    """Raise DigestMismatch if `path` no longer holds the bytes of `blob`."""
    found = sha256_file(str(path))
    if found != blob.digest:
        raise DigestMismatch(f"blob {blob.digest} ({path}) changed after torpor wrote it: it "
                             f"now has digest {found}, and the registry refused it",
                             hint="something wrote to the checkpoint's layout while it was "
                                  "uploaded, or the disk returned other bytes; checkpoint again")


class _Uploader:
    def __init__(self, repo: RepositoryClient, file: io.FileIO, blob: Descriptor,
                 report: Callable[[int], None], rehash: bool = True) -> None:
        self.repo, self.file, self.blob, self.report = repo, file, blob, report
        self.rehash = rehash  # False: the bytes are sent unhashed (a blob written here)
        self.delays = backoff_delays(repo.session.options)
        self.what = f"upload of blob {blob.digest}"
        self.hasher: Hasher = new_hasher(blob.digest)
        self.hashed = 0  # bytes fed to the hasher, from the start of the file
        self.confirmed: tuple[int, Hasher] = (0, self.hasher.copy())  # an offset the registry holds

    def run(self, start: UploadStart) -> None:
        chunk = max(self.repo.session.options.chunk_size, start.chunk_min_length)
        if self.blob.size <= chunk:
            self._monolithic(start.location)
        else:
            self._chunked(start.location, chunk)

    def _monolithic(self, location: str) -> None:
        while True:
            self._rewind(0)  # a new session: the whole blob again
            try:
                self.repo.send_upload("PUT", location, self.what, self._body(self.blob.size),
                                      query={"digest": self.blob.digest}).discard()
                self._verify()
                return
            except TransientError:
                self._wait_or_raise()
                self.repo.cancel_upload(location)
                location = self.repo.start_upload().location
            except RegistryError:
                if self.hashed == self.blob.size:
                    self._verify()  # a layout blob that does not match its digest says so first
                raise

    def _chunked(self, location: str, chunk: int) -> None:
        offset = 0
        while offset < self.blob.size:
            length = min(chunk, self.blob.size - offset)
            self._rewind(offset)
            try:
                response = self.repo.send_upload("PATCH", location, self.what, self._body(length),
                                                 content_range=f"{offset}-{offset + length - 1}")
                said = response.header("Range")
                held = range_end(said) if said else offset + length
                location = self.repo.location_of(response)
                response.discard()
            except TransientError:
                self._wait_or_raise()
                held, location = self._resume_point(location)
            except RegistryError as e:
                if e.status != 416:  # the registry holds another offset than we thought
                    raise
                held, location = self._resume_point(location)
            self.confirmed = (held, self._hasher_at(held))
            offset = held
        self._rewind(self.blob.size)
        self._verify()
        try:
            self.repo.send_upload("PUT", location, self.what, None,
                                  query={"digest": self.blob.digest}).discard()
        except TransientError:
            if not self.repo.blob_exists(self.blob.digest, self.repo.push_scope):
                raise

    def _resume_point(self, location: str) -> tuple[int, str]:
        """Where the registry's copy of the upload ends, or a new session from byte 0."""
        while True:
            try:
                return self.repo.upload_status(location)
            except TransientError:
                self._wait_or_raise()
            except RegistryError as e:
                if e.status not in (400, 404):
                    raise
                break
        self.repo.cancel_upload(location)
        return 0, self.repo.start_upload().location

    def _wait_or_raise(self) -> None:
        """Sleep before the next attempt; re-raise the error being handled when none are left."""
        delay = next(self.delays, None)
        if delay is None:
            raise
        sleep(delay)

    def _body(self, length: int) -> Callable[[], FileBody]:
        """A body of `length` bytes from the current offset; each call (a resend after a 401)
        seeks back there, with the hasher as it was."""
        start = self.hashed

        def observe(chunk: memoryview) -> None:
            if self.rehash:
                self.hasher.update(chunk)
            self.hashed += len(chunk)
            self.report(self.hashed)

        def open_body() -> FileBody:
            self._rewind(start)
            return FileBody(self.file, length, observe)
        return open_body

    def _verify(self) -> None:
        if self.rehash:
            verify_hasher(self.hasher, self.blob.digest, f"blob {self.blob.digest} in the layout")

    def _rewind(self, offset: int) -> None:
        """Seek to `offset`, with the hasher holding exactly the bytes before it."""
        if offset != self.hashed:
            self.hasher, self.hashed = self._hasher_at(offset), offset
        self.file.seek(offset)

    def _hasher_at(self, offset: int) -> Hasher:
        """A hasher of the file's first `offset` bytes, from the nearest state known (without
        rehash, an empty one: nothing is hashed)."""
        if offset == self.hashed or not self.rehash:
            return self.hasher.copy()
        base, known = self.confirmed if self.confirmed[0] <= offset else (0, new_hasher(self.blob.digest))
        hasher = known.copy()
        self.file.seek(base)
        buffer = memoryview(bytearray(BUFFER_SIZE))
        remaining = offset - base
        while remaining:
            n = self.file.readinto(buffer[:min(remaining, BUFFER_SIZE)]) or 0
            if not n:
                raise ImageError(f"blob {self.blob.digest} in the layout shrank while it was uploaded")
            hasher.update(buffer[:n])
            remaining -= n
        return hasher
