"""Push an OCI image-layout directory to a registry.

Order, so that the registry never sees a manifest before what it names:
  1. index.json -> the top manifest or index, then every child manifest and nested index, each
     read digest-checked; every config and layer they name must be in the layout (a layer with
     `urls` may be absent: it is non-distributable and not pushed);
  2. the blobs, largest first, `parallel` at a time: skipped when present, mounted from a
     `mount_from` repository when the registry agrees, uploaded otherwise;
  3. child manifests by digest, deepest first; 4. the top one under the reference's tag.
Manifests are sent byte for byte as the layout holds them, so their digests do not change.
Unknown media types are opaque blobs, never refused.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from torpor.errors import ImageError, RegistryError
from torpor.formats import mediatypes
from torpor.formats.digests import sha256_digest
from torpor.formats.oci import Descriptor
from torpor.nice import lower_priority, restore_priority
from torpor.registry import manifests
from torpor.registry.blob_upload import Outcome, push_blob
from torpor.registry.client import RepositoryClient
from torpor.registry.descriptors import ManifestContents, manifest_contents
from torpor.registry.layout import REF_NAME, Layout
from torpor.registry.options import RegistryOptions
from torpor.registry.progress import TransferProgress
from torpor.registry.reference import Reference, parse_reference
from torpor.registry.session import RegistrySession
from torpor.reporting import ByteProgress

MAX_DEPTH = 8


@dataclass(frozen=True)
class PushResult:
    reference: Reference  # with the pushed digest
    digest: str
    media_type: str
    uploaded: int  # blobs sent
    mounted: int  # blobs mounted from another repository
    existing: int  # blobs the repository already had
    bytes_uploaded: int


@dataclass(frozen=True)
class LayoutManifest:
    descriptor: Descriptor
    body: bytes
    contents: ManifestContents


def push_layout(layout_dir: Path | str, reference: Reference | str, *,
                options: RegistryOptions | None = None, mount_from: Sequence[str] = (),
                progress: ByteProgress | None = None) -> PushResult:
    """Copy the image that `layout_dir`'s index.json names to `reference` (tag `latest` if none).

    index.json with one entry pushes that entry; with several, the one whose
    `org.opencontainers.image.ref.name` is the reference's tag, else index.json itself as an index.
    `progress(bytes done, bytes in all)` follows the blob uploads.
    """
    options = options or RegistryOptions()
    ref = parse_reference(reference) if isinstance(reference, str) else reference
    layout = Layout(Path(layout_dir))
    top = _select_top(layout, ref, options.manifest_limit)
    if ref.digest and ref.digest != top.descriptor.digest:
        raise ImageError(f"{layout.root} holds {top.descriptor.digest}, not {ref.digest}")
    manifests, blobs = walk(layout, top, options.manifest_limit)
    session = RegistrySession.for_reference(ref, options)
    try:
        repo = RepositoryClient(session, session.repository(ref.repository))
        outcomes = _push_blobs(repo, layout, blobs, list(mount_from), options.parallel, progress)
        for child in manifests[:-1]:
            repo.put_manifest(child.descriptor.digest, child.body, child.descriptor.media_type)
        said = repo.put_manifest(ref.digest or ref.tag or "latest", top.body, top.descriptor.media_type)
    finally:
        session.close()
    digest = top.descriptor.digest
    if said and said != digest:
        raise RegistryError(f"registry {ref.registry} stored the manifest as {said}, torpor sent {digest}",
                            hint="the registry rewrote the manifest; it does not keep OCI content as is")
    return PushResult(
        reference=ref.with_digest(digest), digest=digest, media_type=top.descriptor.media_type,
        uploaded=sum(o is Outcome.UPLOADED for o in outcomes.values()),
        mounted=sum(o is Outcome.MOUNTED for o in outcomes.values()),
        existing=sum(o is Outcome.EXISTED for o in outcomes.values()),
        bytes_uploaded=sum(blobs[d].size for d, o in outcomes.items() if o is Outcome.UPLOADED))


def walk(layout: Layout, top: LayoutManifest,
         limit: int) -> tuple[list[LayoutManifest], dict[str, Descriptor]]:
    """Every manifest under `top`, children before parents (top last), and every blob they name."""
    ordered: list[LayoutManifest] = []
    blobs: dict[str, Descriptor] = {}
    seen: set[str] = set()

    def visit(node: LayoutManifest, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ImageError(f"indexes in {layout.root} nest deeper than {MAX_DEPTH} levels")
        seen.add(node.descriptor.digest)
        for child in node.contents.manifests:
            if child.digest not in seen:
                visit(_read_manifest(layout, child, limit), depth + 1)
        for blob in node.contents.blobs:
            if layout.has_blob(blob.digest):
                blobs.setdefault(blob.digest, blob)
            elif not blob.urls:
                raise ImageError(f"blob {blob.digest} ({blob.media_type}) named by manifest "
                                 f"{node.descriptor.digest} is missing from the layout {layout.root}")
        ordered.append(node)

    visit(top, 0)
    return ordered, blobs


def _read_manifest(layout: Layout, descriptor: Descriptor, limit: int) -> LayoutManifest:
    body = layout.read_small(descriptor, limit, "manifest")
    document = manifests.parse_manifest(body, f"manifest {descriptor.digest}")
    return LayoutManifest(descriptor, body, manifest_contents(document, descriptor.media_type,
                                                              f"manifest {descriptor.digest}"))


def _select_top(layout: Layout, ref: Reference, limit: int) -> LayoutManifest:
    entries = layout.index_entries()
    if not entries:
        raise ImageError(f"{layout.root}/index.json names no manifest")
    named = [e for e in entries if ref.tag and e.annotations.get(REF_NAME) == ref.tag]
    if len(entries) == 1 or len(named) == 1:
        return _read_manifest(layout, entries[0] if len(entries) == 1 else named[0], limit)
    body = (layout.root / "index.json").read_bytes()
    if len(body) > limit:
        raise ImageError(f"{layout.root}/index.json is larger than the manifest limit of {limit} bytes")
    document = manifests.parse_manifest(body, f"{layout.root}/index.json")
    descriptor = Descriptor(mediatypes.OCI_INDEX, sha256_digest(body), len(body))
    return LayoutManifest(descriptor, body, manifest_contents(document, mediatypes.OCI_INDEX, "index.json"))


def _push_blobs(repo: RepositoryClient, layout: Layout, blobs: dict[str, Descriptor], mount_from: list[str],
                parallel: int, callback: ByteProgress | None) -> dict[str, Outcome]:
    progress = TransferProgress(sum(b.size for b in blobs.values()), callback)
    largest_first = sorted(blobs.values(), key=lambda b: b.size, reverse=True)
    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="torpor-push") as pool:
        futures = {pool.submit(push_blob, repo, layout.blob_path(b.digest), b, mount_from,
                               progress.reporter(b.digest)): b.digest for b in largest_first}
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future in done:
            if (error := future.exception()) is not None:
                raise error
    return {digest: future.result() for future, digest in futures.items()}


def _at_main_priority() -> None:
    restore_priority(threading.get_native_id())


class EarlyBlobs:
    """Blobs uploaded while the image is still being built (`push_layout` then finds them
    present and sends only the manifests): a checkpoint's layers go up as each finishes
    compressing, instead of after the last one. After the block, `uploaded`, `mounted`,
    `existing` and `bytes_uploaded` count what happened to them (a registry that holds a blob
    already is only asked, HEAD, not sent it).

        with EarlyBlobs(ref, options) as early:
            early.submit(path, descriptor)     # from any thread; written_here=True for a blob
                                               # whose digest was computed as it was written
        push_layout(layout, ref, options=options)

    A blob is sent once, however often it is submitted. One submitted `behind` goes up on
    threads of its own at nice.NICE below the caller: while CRIU holds the workload frozen,
    the upload takes only the CPU the dump leaves; `forward()` once the dump is over brings
    those threads back, and later blobs go up at the caller's priority.
    """

    def __init__(self, reference: Reference | str, options: RegistryOptions | None = None,
                 mount_from: Sequence[str] = ()) -> None:
        self.options = options or RegistryOptions()
        ref = parse_reference(reference) if isinstance(reference, str) else reference
        self._session = RegistrySession.for_reference(ref, self.options)
        self._repo = RepositoryClient(self._session, self._session.repository(ref.repository))
        self._mount_from = list(mount_from)
        # (its threads start at the nice of the thread that submits: brought to the main's)
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.options.parallel),
                                        thread_name_prefix="torpor-early-push",
                                        initializer=_at_main_priority)
        self._behind: ThreadPoolExecutor | None = None
        self._futures: list[tuple[Descriptor, Future[Outcome]]] = []
        self._submitted: set[str] = set()
        self._behind_threads: list[int] = []
        self._forward = False
        self._lock = threading.Lock()
        self.bytes = 0
        self.uploaded = self.mounted = self.existing = self.bytes_uploaded = 0
        self.sent: set[str] = set()   # the digests uploaded or mounted

    def submit(self, path: Path, blob: Descriptor, written_here: bool = False,
               behind: bool = False) -> None:
        """Upload `blob` from `path` (unless it was submitted before); `written_here`: its
        digest was computed here from the bytes written to `path`, so they are sent without
        hashing them again; `behind`: on the niced threads (while a dump runs)."""
        with self._lock:
            if blob.digest in self._submitted:
                return
            self._submitted.add(blob.digest)
            self.bytes += blob.size
            pool = self._pool
            if behind and not self._forward:
                if self._behind is None:
                    self._behind = ThreadPoolExecutor(
                        max_workers=max(1, self.options.parallel),
                        thread_name_prefix="torpor-early-push-behind",
                        initializer=self._behind_thread)
                pool = self._behind
            self._futures.append((blob, pool.submit(push_blob, self._repo, Path(path), blob,
                                                    self._mount_from, lambda offset: None,
                                                    written_here=written_here)))

    def _behind_thread(self) -> None:
        lower_priority()
        with self._lock:
            self._behind_threads.append(threading.get_native_id())
            if not self._forward:
                return
        restore_priority(threading.get_native_id())

    def forward(self) -> None:
        """The dump is over: the uploads submitted `behind` go on at the caller's priority."""
        with self._lock:
            self._forward = True
            threads = list(self._behind_threads)
        for thread in threads:
            restore_priority(thread)

    def check_access(self) -> None:
        """The registry answers and takes a push from these credentials: one upload started
        and cancelled (RegistryError or AuthError otherwise), before there is anything to send."""
        started = self._repo.start_upload()
        if started.location:
            self._repo.cancel_upload(started.location)

    def __enter__(self) -> EarlyBlobs:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        try:
            if error is None:
                for blob, future in self._futures:
                    outcome = future.result()  # raises the first upload error
                    self.uploaded += outcome is Outcome.UPLOADED
                    self.mounted += outcome is Outcome.MOUNTED
                    self.existing += outcome is Outcome.EXISTED
                    self.bytes_uploaded += blob.size if outcome is Outcome.UPLOADED else 0
                    if outcome is not Outcome.EXISTED:
                        self.sent.add(blob.digest)
            else:
                for _, future in self._futures:
                    future.cancel()
        finally:
            self._pool.shutdown(wait=True)
            if self._behind is not None:
                self._behind.shutdown(wait=True)
            self._session.close()
