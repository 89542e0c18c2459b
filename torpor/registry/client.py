"""The OCI distribution-spec calls on one repository: blobs, uploads, manifests.

Each method is one request (plus auth and retries, from the session) and knows which statuses
mean what. Streaming uploads and downloads are built on these in blob_upload and blob_download.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote, urlencode, urljoin

from torpor.errors import RegistryError
from torpor.formats import mediatypes
from torpor.formats.digests import sha256_digest, verify_bytes
from torpor.registry import manifests
from torpor.registry.response import Response
from torpor.registry.session import FileBody, RegistrySession


@dataclass(frozen=True)
class UploadStart:
    """The answer to POST /blobs/uploads/: mounted, or an upload session at `location`."""

    mounted: bool
    location: str = ""
    chunk_min_length: int = 0


@dataclass(frozen=True)
class FetchedManifest:
    body: bytes
    media_type: str
    digest: str


class RepositoryClient:
    def __init__(self, session: RegistrySession, repository: str) -> None:
        self.session, self.repository = session, repository
        self.pull_scope = f"repository:{repository}:pull"
        self.push_scope = f"repository:{repository}:pull,push"

    def _url(self, tail: str) -> str:
        return self.session.url(f"/v2/{self.repository}/{tail}")

    def blob_exists(self, digest: str, scope: str | None = None) -> bool:
        response = self.session.request("HEAD", self._url(f"blobs/{digest}"), ok=(200, 404),
                                        scope=scope or self.pull_scope, what=f"HEAD blob {digest}")
        response.close()
        return response.status == 200

    def start_upload(self, mount_digest: str | None = None, mount_from: str | None = None) -> UploadStart:
        """POST an upload; with `mount_*`, ask for a cross-repository mount first."""
        scope, query = self.push_scope, ""
        if mount_digest and mount_from:
            scope += f" repository:{mount_from}:pull"
            query = "?" + urlencode({"mount": mount_digest, "from": mount_from})
        url = self._url(f"blobs/uploads/{query}")
        what = f"mount {mount_digest} from {mount_from}" if query else "start a blob upload"
        response = self.session.request("POST", url, ok=(201, 202), scope=scope, what=what)
        response.discard()
        if response.status == 201:
            return UploadStart(mounted=True)
        minimum = response.header("OCI-Chunk-Min-Length") or "0"
        return UploadStart(False, self._location(response, url), int(minimum) if minimum.isdigit() else 0)

    def upload_status(self, location: str) -> tuple[int, str]:
        """(bytes the registry holds, the session's new location) of an upload in progress."""
        response = self.session.request("GET", location, ok=(204,), scope=self.push_scope,
                                        what="GET upload status")
        response.discard()
        return range_end(response.header("Range")), self._location(response, location)

    def cancel_upload(self, location: str) -> None:
        try:
            self.session.request("DELETE", location, ok=(204, 404), scope=self.push_scope,
                                 what="cancel an upload", retry=False).discard()
        except RegistryError:
            pass  # best effort: the registry expires abandoned uploads

    def send_upload(self, method: str, location: str, what: str, open_body: Callable[[], FileBody] | None,
                    query: dict[str, str] | None = None, content_range: str | None = None) -> Response:
        """PATCH a chunk or PUT the end of an upload, streaming the body from a file.
        `open_body` positions the file at the body's start each time it is called."""
        url = location
        if query:
            url += ("&" if "?" in url else "?") + urlencode(query)
        headers = {"Content-Type": "application/octet-stream"}
        if content_range:
            headers["Content-Range"] = content_range
        return self.session.send_file(method, url, scope=self.push_scope, what=what, headers=headers,
                                      ok=(201,) if method == "PUT" else (202,),
                                      open_body=open_body or (lambda: FileBody(_Empty(), 0)))

    def location_of(self, response: Response) -> str:
        return self._location(response, response.url)

    def get_manifest(self, reference: str, limit: int, expected_digest: str | None = None) -> FetchedManifest:
        """A manifest or index, at most `limit` bytes, digest-checked against the reference's
        digest or the registry's Docker-Content-Digest."""
        what = f"GET manifest {self.repository}:{reference}" if ":" not in reference else \
            f"GET manifest {self.repository}@{reference}"
        response = self.session.request("GET", self._url(f"manifests/{quote(reference, safe=':')}"),
                                        ok=(200,), scope=self.pull_scope, what=what,
                                        headers={"Accept": mediatypes.MANIFEST_ACCEPT})
        said_type = (response.header("Content-Type") or "").split(";")[0].strip()
        said_digest = response.header("Docker-Content-Digest")
        body = response.read_limited(limit)
        by_digest = reference if ":" in reference else None
        digest = expected_digest or by_digest or said_digest
        if digest:
            verify_bytes(body, digest, f"manifest {self.repository}@{digest}")
        else:
            digest = sha256_digest(body)
        generic = said_type in ("", "application/json", "text/plain", "application/octet-stream")
        return FetchedManifest(body, manifests.manifest_media_type(body, None if generic else said_type),
                               digest)

    def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        response = self.session.request("PUT", self._url(f"manifests/{quote(reference, safe=':')}"),
                                        ok=(201,), scope=self.push_scope, body=body,
                                        what=f"PUT manifest {self.repository}:{reference}",
                                        headers={"Content-Type": media_type})
        response.discard()
        return response.header("Docker-Content-Digest") or ""

    def list_tags(self, limit: int = 4 << 20) -> list[str]:
        """Every tag of the repository (following `Link` pages)."""
        tags: list[str] = []
        url = self._url("tags/list")
        for _ in range(1000):
            response = self.session.request("GET", url, ok=(200, 404), scope=self.pull_scope,
                                            what=f"GET tags of {self.repository}")
            body = response.read_limited(limit)
            if response.status == 404:
                return []
            try:
                page = json.loads(body).get("tags") or []
            except (ValueError, AttributeError):
                raise RegistryError(f"registry {self.session.registry} answered the tag list of "
                                    f"{self.repository} with something that is not JSON") from None
            tags += [t for t in page if isinstance(t, str)]
            link = response.header("Link")
            if not link or 'rel="next"' not in link:
                return tags
            url = urljoin(url, link.split(";")[0].strip().strip("<>"))
        return tags

    def delete_manifest(self, digest: str) -> bool:
        """DELETE a manifest by digest (with every tag on it); False if it was not there.
        A registry that does not allow deletes says so in words (RegistryError)."""
        response = self.session.request("DELETE", self._url(f"manifests/{digest}"),
                                        ok=(202, 404, 405), scope=self.push_scope,
                                        what=f"DELETE manifest {self.repository}@{digest}",
                                        retry=False)
        response.discard()
        if response.status == 405:
            raise RegistryError(
                f"registry {self.session.registry} does not allow deleting manifests "
                f"({self.repository}@{digest} is kept)",
                hint="enable deletes on the registry (distribution/docker-registry: "
                     "REGISTRY_STORAGE_DELETE_ENABLED=true, or storage.delete.enabled in its "
                     "config), or remove old generations with the registry's own tools")
        return response.status == 202

    def open_blob(self, digest: str, offset: int = 0) -> Response:
        """GET a blob from byte `offset` (200 from the start, 206 from the offset)."""
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        return self.session.request("GET", self._url(f"blobs/{digest}"), ok=(200, 206), headers=headers,
                                    scope=self.pull_scope, what=f"GET blob {digest}")

    def read_range(self, digest: str, offset: int, length: int) -> bytearray:
        """`length` bytes of a blob from `offset` (a Range request; a registry that answers
        with the whole blob is read up to the range). Transient failures are retried; the
        bytes are the caller's to verify."""
        response = self.session.request(
            "GET", self._url(f"blobs/{digest}"), ok=(200, 206), scope=self.pull_scope,
            headers={"Range": f"bytes={offset}-{offset + length - 1}"},
            what=f"GET bytes {offset}-{offset + length - 1} of blob {digest}")
        data = bytearray(length)
        view, got = memoryview(data), 0
        try:
            if response.status == 200:   # the whole blob: read up to the range
                skip = offset
                for piece in response.iter_chunks():
                    if skip >= len(piece):
                        skip -= len(piece)
                        continue
                    take = piece[skip:skip + length - got]
                    view[got:got + len(take)] = take
                    got, skip = got + len(take), 0
                    if got == length:
                        break
            else:
                while got < length and (n := response.readinto(view[got:])):
                    got += n
        finally:
            response.close()
        if got < length:
            raise RegistryError(f"registry {self.session.registry} ended blob {digest} "
                                f"{length - got} bytes short of the range asked")
        return data

    def _location(self, response: Response, request_url: str) -> str:
        location = response.header("Location")
        if not location:
            raise RegistryError(f"registry {self.session.registry} answered {response.what} "
                                "without a Location")
        return urljoin(request_url, location)


def range_end(header: str | None) -> int:
    """Bytes held according to a `Range: 0-<last>` upload header (0 without one)."""
    if not header:
        return 0
    _, _, last = header.partition("-")
    return int(last) + 1 if last.strip().isdigit() else 0


class _Empty:
    def readinto(self, buffer: memoryview, /) -> int:
        return 0
