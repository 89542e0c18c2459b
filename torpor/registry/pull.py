"""Pull from a registry into an OCI image-layout directory, in two phases.

1. `fetch_metadata(ref)`: the top manifest or index, every child manifest and nested index, and
   every config of up to `config_limit` bytes, into memory, digest-checked. Nothing is written.
   The caller looks at them (torpor checks the node against the checkpoint's metadata here) and
   chooses layers.
2. `PullPlan.download(layout_dir, layers)`: manifests, configs and the chosen layers (and any
   larger config) into the layout, `parallel` at a time, each streamed to a temporary file and
   renamed into place once its size and digest match; index.json names the top one last. On any
   failure every file this pull added is removed (and the layout directory, if it made it).

`pull(ref, layout_dir, want=...)` does both, asking `want(layer)` about each layer. Unknown media
types are opaque blobs; blobs the layout already holds intact are not downloaded again.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from torpor.errors import DigestMismatch, ImageError, RegistryError
from torpor.formats import mediatypes
from torpor.formats.digests import verify_bytes
from torpor.formats.oci import Descriptor
from torpor.registry import manifests
from torpor.registry.arrivals import Arrivals
from torpor.registry.blob_download import download_blob
from torpor.registry.client import FetchedManifest, RepositoryClient
from torpor.registry.descriptors import ManifestContents, manifest_contents
from torpor.registry.layout import Layout
from torpor.registry.options import RegistryOptions
from torpor.registry.progress import TransferProgress
from torpor.registry.reference import Reference, parse_reference
from torpor.registry.session import RegistrySession
from torpor.reporting import ByteProgress

MAX_DEPTH = 8


@dataclass(frozen=True)
class PulledManifest:
    """A manifest or index as the registry holds it; `config` is its config blob when small."""

    descriptor: Descriptor
    body: bytes
    document: dict[str, Any]
    contents: ManifestContents
    config: bytes | None
    parent: Descriptor | None

    @property
    def artifact_type(self) -> str | None:
        value = self.document.get("artifactType")
        return value if isinstance(value, str) else None

    @property
    def annotations(self) -> dict[str, str]:
        value = self.document.get("annotations")
        return dict(value) if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Layer:
    """A layer offered to the caller: the descriptor and the manifest that names it."""

    manifest: PulledManifest
    descriptor: Descriptor


@dataclass(frozen=True)
class PullResult:
    reference: Reference  # with the pulled digest
    digest: str
    media_type: str
    layout: Path
    downloaded: int  # configs and layers fetched over the network, in both phases (not manifests)
    bytes_downloaded: int
    skipped: list[Descriptor]  # layers the caller did not want: not in the layout


class PullPlan:
    """What `fetch_metadata` found; `download` writes it. Close it (or use `with`) when done."""

    def __init__(self, ref: Reference, session: RegistrySession, manifests: list[PulledManifest]) -> None:
        self.reference, self.manifests, self._session = ref, manifests, session
        self._repo = RepositoryClient(session, session.repository(ref.repository))
        self.top = manifests[0]

    @property
    def layers(self) -> list[Layer]:
        """Every layer, once per digest, in manifest order."""
        found: dict[str, Layer] = {}
        for manifest in self.manifests:
            for layer in manifest.contents.layers:
                found.setdefault(layer.digest, Layer(manifest, layer))
        return list(found.values())

    def download(self, layout_dir: Path | str, layers: Iterable[Layer] | None = None,
                 progress: ByteProgress | None = None,
                 arrivals: Arrivals | None = None) -> PullResult:
        """Write the metadata and `layers` (all when None) into `layout_dir`. With `arrivals`,
        the layers come in the order given (not the largest first), each told to `arrivals`
        once it is in place and checked, and none is started once `arrivals.stopped` is set:
        a rebuild reads them as they come (registry/arrivals.py)."""
        chosen = self.layers if layers is None else list(layers)
        chosen_digests = {layer.descriptor.digest for layer in chosen}
        layout = Layout(Path(layout_dir))
        created = layout.create()
        added: list[Path] = []
        try:
            to_fetch = self._write_metadata(layout, added)
            to_fetch.update({d.descriptor.digest: d.descriptor for d in chosen
                             if not _intact(layout, d.descriptor)})
            if arrivals is not None:
                for digest in chosen_digests - set(to_fetch):   # in place already
                    arrivals.arrived(digest, str(layout.blob_path(digest)))
            fetched = self._fetch(layout, list(to_fetch.values()), added, progress, arrivals)
            layout.tag(self._top_entry(), self.reference.tag)
        except BaseException:
            if arrivals is None:   # else a rebuild may be reading them: its caller cleans up
                for path in added:
                    path.unlink(missing_ok=True)
            if created:
                shutil.rmtree(layout.root, ignore_errors=True)
            raise
        skipped = [layer.descriptor for layer in self.layers if layer.descriptor.digest not in chosen_digests]
        configs = {m.contents.config.digest: m.contents.config for m in self.manifests
                   if m.contents.config is not None and m.config is not None}
        network = [*configs.values(), *fetched]
        return PullResult(self.reference.with_digest(self.top.descriptor.digest), self.top.descriptor.digest,
                          self.top.descriptor.media_type, layout.root, len(network),
                          sum(b.size for b in network), skipped)

    def read_range(self, digest: str, offset: int, length: int) -> bytearray:
        """Bytes of one of the image's blobs, unverified (a lazy restore's chunk, lazy/)."""
        return self._repo.read_range(digest, offset, length)

    def close(self) -> None:
        self._session.close()

    def _top_entry(self) -> Descriptor:
        """The top descriptor for index.json, with the artifactType its document declares."""
        top = self.top.descriptor
        raw = {"artifactType": self.top.artifact_type} if self.top.artifact_type else {}
        return Descriptor(top.media_type, top.digest, top.size, raw)

    def __enter__(self) -> PullPlan:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def _write_metadata(self, layout: Layout, added: list[Path]) -> dict[str, Descriptor]:
        """Write manifests and small configs; returns the large configs still to fetch."""
        large: dict[str, Descriptor] = {}
        for manifest in self.manifests:
            documents = [(manifest.descriptor, manifest.body)]
            config = manifest.contents.config
            if config is not None and manifest.config is not None:
                documents.append((config, manifest.config))
            elif config is not None and not _intact(layout, config):
                large[config.digest] = config
            for descriptor, body in documents:
                if not _intact(layout, descriptor):
                    added.append(layout.write_small(descriptor.digest, body,
                                                    self._session.options.fsync_blobs))
        return large

    def _fetch(self, layout: Layout, blobs: list[Descriptor], added: list[Path],
               callback: ByteProgress | None, arrivals: Arrivals | None = None
               ) -> list[Descriptor]:
        progress = TransferProgress(sum(b.size for b in blobs), callback)
        parallel = max(1, self._session.options.parallel)
        largest_first = sorted(blobs, key=lambda b: b.size, reverse=True) if arrivals is None \
            else blobs
        durable = self._session.options.fsync_blobs

        def one(blob: Descriptor) -> Path:
            report = progress.reporter(blob.digest)
            if arrivals is not None:
                if arrivals.stopped.is_set():
                    raise ImageError("the download was stopped: the rebuild beside it ended")
                told = report

                def report(offset: int) -> None:   # a blob under way ends with the rebuild
                    if arrivals.stopped.is_set():
                        raise ImageError("the download was stopped: the rebuild beside it ended")
                    told(offset)
            growing = None if arrivals is None or not arrivals.partial else \
                lambda path, size: arrivals.growing(blob.digest, path, size)
            path = download_blob(self._repo, blob, layout, report, durable, growing)
            if arrivals is not None:
                arrivals.arrived(blob.digest, str(path))
            return path

        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="torpor-pull") as pool:
            futures = [pool.submit(one, b) for b in largest_first]
            _, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for future in pending:
                future.cancel()
        finished = [f for f in futures if not f.cancelled()]
        added.extend(f.result() for f in finished if f.exception() is None)
        for future in finished:
            if (error := future.exception()) is not None:
                raise error
        return largest_first


def fetch_metadata(reference: Reference | str, options: RegistryOptions | None = None,
                   check_top: Callable[[RepositoryClient, Descriptor], None] | None = None) -> PullPlan:
    """Phase 1: every manifest and small config under `reference`, digest-checked, in memory.
    `check_top(repository, top)` sees the top manifest or index first: it may raise to stop
    the pull before anything else is fetched (torpor.signing checks signatures there)."""
    options = options or RegistryOptions()
    ref = parse_reference(reference) if isinstance(reference, str) else reference
    session, fetched = _resolve(ref, options)
    try:
        repo = RepositoryClient(session, session.repository(ref.repository))
        top = Descriptor(fetched.media_type, fetched.digest, len(fetched.body))
        if check_top is not None:
            check_top(repo, top)
        manifests: list[PulledManifest] = []
        _visit(repo, options, top, fetched.body, None, manifests, 0)
    except BaseException:
        session.close()
        raise
    return PullPlan(ref, session, manifests)


def _resolve(ref: Reference, options: RegistryOptions) -> tuple[RegistrySession, FetchedManifest]:
    """The top manifest, from the first host that has it (a mirror or pull-through cache the
    node's hosts.toml names, else the registry), and that host's session for the rest of the
    pull. A mirror that fails or lacks it is passed over, as containerd does; every byte it
    serves is digest-checked all the same, and what it resolves is checked as the origin's."""
    capability = "pull" if ref.digest else "resolve"
    sessions = RegistrySession.candidates(ref, options, capability)
    passed: list[str] = []
    for n, session in enumerate(sessions):
        try:
            repo = RepositoryClient(session, session.repository(ref.repository))
            return session, repo.get_manifest(ref.reference, options.manifest_limit,
                                              expected_digest=ref.digest)
        except (RegistryError, DigestMismatch) as e:
            session.close()
            if n == len(sessions) - 1:
                if passed:   # the user sees why each mirror was passed over
                    e.message += f" (after {'; '.join(passed)})"
                raise
            passed.append(f"{session.endpoint.describe()}: {e.message}")
    raise AssertionError("candidates() gives at least one host")


def pull(reference: Reference | str, layout_dir: Path | str, *, want: Callable[[Layer], bool] | None = None,
         options: RegistryOptions | None = None, progress: ByteProgress | None = None) -> PullResult:
    """Both phases: `want(layer)` chooses the layers to download (all when None); it may raise to
    stop the pull before anything large is downloaded or anything is written."""
    with fetch_metadata(reference, options) as plan:
        chosen = [layer for layer in plan.layers if want is None or want(layer)]
        return plan.download(layout_dir, chosen, progress)


def _visit(repo: RepositoryClient, options: RegistryOptions, descriptor: Descriptor, body: bytes,
           parent: Descriptor | None, out: list[PulledManifest], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ImageError(f"indexes under {repo.repository} nest deeper than {MAX_DEPTH} levels")
    what = f"manifest {repo.repository}@{descriptor.digest}"
    try:
        document = manifests.parse_manifest(body, what)
        contents = manifest_contents(document, descriptor.media_type, what)
    except ImageError:
        if descriptor.media_type in mediatypes.MANIFEST_TYPES or parent is None:
            raise
        document, contents = {}, ManifestContents([], None, [])  # an unknown kind of manifest: opaque
    config = None
    if contents.config is not None and contents.config.size <= options.config_limit:
        config = _small_blob(repo, contents.config, options.config_limit)
    out.append(PulledManifest(descriptor, body, document, contents, config, parent))
    for child in contents.manifests:
        if any(m.descriptor.digest == child.digest for m in out):
            continue
        fetched = repo.get_manifest(child.digest, options.manifest_limit, expected_digest=child.digest)
        if len(fetched.body) != child.size:
            raise ImageError(f"manifest {repo.repository}@{child.digest} is {len(fetched.body)} bytes, "
                             f"the index says {child.size}")
        _visit(repo, options, child, fetched.body, descriptor, out, depth + 1)


def _small_blob(repo: RepositoryClient, blob: Descriptor, limit: int) -> bytes:
    what = f"config {blob.digest} of {repo.repository}"
    data = repo.open_blob(blob.digest).read_limited(limit)
    if len(data) != blob.size:
        raise ImageError(f"{what} is {len(data)} bytes on the registry, its descriptor says {blob.size}")
    verify_bytes(data, blob.digest, what)
    return data


def _intact(layout: Layout, blob: Descriptor) -> bool:
    """Whether the layout already holds `blob` with the right size and digest."""
    return layout.holds_intact(blob)
