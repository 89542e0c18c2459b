"""A checkpoint image as one generation of a chain: its chunk index, the previous generation a
new one builds on, and the blobs the local store already holds.

A new generation stores only the chunks its previous generation does not hold (packs.py), so
building one starts by finding that previous generation in the local store, in this order:
 1. the image the container was restored from (containerd's image label io.torpor.checkpoint
    names its index digest);
 2. the store's image under the same reference (an older `latest`);
 3. the newest image of the same container (the image index's container annotation);
 4. the newest image of the same repository.
A new generation reuses the chunk records of the one it builds on unread, so only a chunk index
this node knows to be sound may be that one (sound_indexes.py): one it wrote itself, or one it
verified, every chunk it offers read back and checked. Rules 3 and 4 go by what an image says
of itself (its container annotation, its creation date, its reference), so they pick only among
indexes already known sound; the images of rules 1 and 2 (the node's own label, the user's
reference) are verified the first time. An image that fails is passed over, and without a sound
one the generation is written whole: a hostile image in the store cannot poison it.
Its layers are hard-linked into a holding directory first, so that replacing the store entry
they live in (a moving tag) does not lose them before the new image links them in.

A pull or restore links the blobs the store already holds (any image's layout) instead of
downloading them; every blob is still checked where it is read (chunks and files by their
sha256 in a rebuild, tar layers as they are extracted, containerd on import).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from torpor.errors import ImageError
from torpor.formats import annotations as ann
from torpor.formats import timestamps
from torpor.formats.chunk_index import ChunkIndex
from torpor.formats.oci import Descriptor
from torpor.image import sound_indexes
from torpor.image.chunker import DEFAULT_PARAMS, ChunkerParams
from torpor.image.packs import ChunkLocation, known_chunks
from torpor.image.store import Store
from torpor.image.unpack import MANIFEST_LIMIT, index_layer, open_layout, read_index
from torpor.registry.layout import Layout
from torpor.registry.reference import parse_reference


def params_of(index: ChunkIndex | None) -> ChunkerParams:
    """Cut a next generation as its previous one was cut, so that their chunks match."""
    if index is None:
        return DEFAULT_PARAMS
    c = index.chunking
    return ChunkerParams(c.min_size, c.avg_size, c.max_size)


@dataclass(frozen=True)
class Previous:
    """The generation a new one builds on."""

    ref: str                  # its reference in the local store
    index_digest: str         # its image index's digest
    chunks: ChunkIndex
    packs: dict[str, Path]    # pack digest -> a file holding it (a link in the holding dir)
    blobs: frozenset[str]     # every blob of its image: what a new one need not send again
    held: dict[str, Path] = field(default_factory=dict)   # its layers, linked in the holding dir

    @cached_property
    def known(self) -> dict[str, ChunkLocation]:
        """Its chunks that a new generation refers to instead of storing (packs.py); one
        mapping, whoever asks (an EarlyPacker's packs are taken where it had the same)."""
        return {d: loc for d, loc in known_chunks(self.chunks).items() if loc.pack in self.packs}


@dataclass(frozen=True)
class StoredImage:
    """An image of the local store, as its index says: who and when."""

    ref: str
    layout: Path
    index_digest: str
    container: str
    created: str


def stored_images(store: Store) -> list[StoredImage]:
    out = []
    for ref, layout_dir in store.layouts():
        layout = Layout(layout_dir)
        try:
            entries = layout.index_entries()
            if len(entries) != 1:
                continue
            body = layout.read_small(entries[0], MANIFEST_LIMIT, "index")
        except (ImageError, OSError):
            continue
        try:
            annotations = json.loads(body).get("annotations") or {}
        except ValueError:
            continue
        out.append(StoredImage(ref, layout_dir, entries[0].digest,
                              str(annotations.get(ann.CONTAINER, "")),
                              str(annotations.get(ann.CREATED, ""))))
    return out


def repository_of(ref: str) -> str | None:
    """`registry/repository` of a reference; None for one that does not parse."""
    try:
        parsed = parse_reference(ref)
    except Exception:
        return None
    return f"{parsed.registry}/{parsed.repository}"


def find_previous(store: Store, *, index_digest: str | None, ref: str | None,
                  container_id: str) -> list[tuple[StoredImage, bool]]:
    """The candidates, best first, each with whether it may be verified (rules 1 and 2) or must
    be known sound already (rules 3 and 4)."""
    candidates = stored_images(store)
    newest = sorted(candidates, key=lambda c: timestamps.order(c.created), reverse=True)
    repository = repository_of(ref) if ref else None
    out: list[tuple[StoredImage, bool]] = []
    seen: set[str] = set()
    for match, may_verify in ((lambda c: bool(index_digest) and c.index_digest == index_digest, True),
                              (lambda c: bool(ref) and c.ref == ref, True),
                              (lambda c: c.container == container_id, False),
                              (lambda c: repository is not None and repository_of(c.ref) == repository,
                               False)):
        for candidate in newest:
            if match(candidate) and candidate.ref not in seen:
                seen.add(candidate.ref)
                out.append((candidate, may_verify))
    return out


def hold_previous(store: Store, hold: Path, *, index_digest: str | None, ref: str | None,
                  container_id: str) -> Previous | None:
    """The previous generation, its layers (packs, tar layers, base image layers) linked under
    `hold` (same filesystem as the store); None when the store holds no earlier image with a
    chunk index known or found sound."""
    for candidate, may_verify in find_previous(store, index_digest=index_digest, ref=ref,
                                               container_id=container_id):
        previous = _hold(store, candidate, hold, may_verify)
        if previous is not None:
            return previous
    return None


def likely_previous(store: Store, *, index_digest: str | None, ref: str | None,
                    container_id: str) -> StoredImage | None:
    """The image a checkpoint now would build on, unless its verification fails (for an
    estimate, which reads no pack)."""
    for candidate, may_verify in find_previous(store, index_digest=index_digest, ref=ref,
                                               container_id=container_id):
        if may_verify:
            return candidate
        try:
            layer = index_layer(open_layout(str(candidate.layout)))
        except (ImageError, OSError):
            continue
        if layer is not None and sound_indexes.recorded(store.root, layer.digest):
            return candidate
    return None


def _hold(store: Store, candidate: StoredImage, hold: Path, may_verify: bool) -> Previous | None:
    try:
        image = open_layout(str(candidate.layout))
        layer = index_layer(image)
        if layer is None:
            return None
        sound = sound_indexes.recorded(store.root, layer.digest)
        if not sound and not may_verify:
            return None
        layout = Layout(candidate.layout)
        chunks = read_index(layout, layer)
    except (ImageError, OSError):
        return None  # a damaged or foreign entry: build a full generation instead
    hold.mkdir(mode=0o700, parents=True, exist_ok=True)
    layers = [*image.state_layers, *image.runnable_blobs[1:]]  # packs, tar layers, base layers
    held: dict[str, Path] = {}
    for blob in layers:
        source = layout.blob_path(blob.digest)
        target = hold / blob.digest.split(":", 1)[1]
        try:
            if source.stat().st_size != blob.size:
                continue
            if not target.exists():
                link_or_copy(source, target)
        except OSError:
            continue
        held[blob.digest] = target
    packs = {p.digest: held[p.digest] for p in chunks.packs if p.digest in held}
    blobs = {d.digest for d in layers} | {image.runnable_blobs[0].digest}
    blobs |= {image.index.digest, image.state.digest, image.runnable.digest}
    config = image.state_manifest.get("config", {}).get("digest")
    if isinstance(config, str):
        blobs.add(config)
    previous = Previous(candidate.ref, candidate.index_digest, chunks, packs, frozenset(blobs),
                        held)
    if not sound:
        if not sound_indexes.verify(chunks, packs, previous.known.keys()):
            return None
        sound_indexes.record(store.root, layer.digest)
    return previous


def link_or_copy(source: Path, target: Path) -> None:
    """`target` as a hard link to `source`, or a copy (0600) across filesystems."""
    try:
        os.link(source, target)
    except OSError as e:
        if e.errno not in (18, 1, 31):  # EXDEV, EPERM (protected links), EMLINK
            raise
        partial = target.with_name(target.name + ".partial")
        shutil.copyfile(source, partial)
        os.chmod(partial, 0o600)
        os.replace(partial, target)


def hold_store_blobs(store: Store, blobs: list[Descriptor], hold: Path) -> dict[str, Path]:
    """The blobs of `blobs` some image in the store holds, linked under `hold`."""
    held: dict[str, Path] = {}
    for blob in blobs:
        source = store.find_blob(blob.digest, blob.size)
        if source is None or blob.digest in held:
            continue
        hold.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = hold / blob.digest.split(":", 1)[1]
        try:
            if not target.exists():
                link_or_copy(source, target)
        except OSError:
            continue
        held[blob.digest] = target
    return held


def place(held: dict[str, Path], layout_dir: str | Path) -> list[str]:
    """Link the held blobs into the layout at `layout_dir` (made if need be); their digests."""
    layout = Layout(Path(layout_dir))
    layout.create()
    placed = []
    for digest, source in held.items():
        target = layout.blob_path(digest)
        layout.blob_dir(digest)
        if not target.exists():
            link_or_copy(source, target)
        placed.append(digest)
    return placed
