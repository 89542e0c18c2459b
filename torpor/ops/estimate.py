"""`torpor estimate CONTAINER`: how big a checkpoint of a running container would be, and how
many bytes the next one would add to its previous generation, without stopping it.

Steps, in order (nothing is frozen, nothing written but the estimate record):
 1. read the container and its task from containerd; its processes from its cgroup;
 2. find its previous generation in the local store, as a checkpoint would
    (image/generations.py), and the chunks its index holds;
 3. memory: each process's pages as CRIU would dump them (capture/memory.py), cut into chunks
    exactly as a checkpoint cuts pages-*.img and hashed: chunks the previous generation holds
    cost their stored size in a full checkpoint and nothing in the next; new ones are
    compressed (a sample of them) to know their stored size;
 4. the read-write layer (the overlay upper directory) and the volumes a checkpoint would save:
    their tar size, compressed like a sample of their files; new when anything in them changed
    after the previous generation was made (a deterministic layer changes as a whole);
 5. GPU memory (NVML, per process): what the CUDA driver would bring into host memory; counted
    in full as new, an upper bound, since device memory can only be compared at checkpoint;
 6. metadata: the chunk index, CRIU's small images, torpor's state;
 7. keep the estimate in the state dir: the next checkpoint records it beside its real figures.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

from torpor.atomicfile import write_atomic
from torpor.capture import files as file_policy
from torpor.capture import memory, rootfs
from torpor.capture import volumes as volume_io
from torpor.capture.freezer import Cgroup
from torpor.config import Config
from torpor.containerd.api.task_pb2 import PAUSED, RUNNING
from torpor.containerd.client import Client
from torpor.errors import CheckpointError, ContainerdError, FormatError, ImageError, NotFound
from torpor.formats import annotations as ann
from torpor.formats import mediatypes as mt
from torpor.formats import names, timestamps
from torpor.formats.chunk_index import ChunkIndex
from torpor.formats.estimate import Estimate, EstimatePart
from torpor.image.chunker import StreamChunker
from torpor.image.generations import likely_previous, params_of
from torpor.image.packfile import compressor
from torpor.image.packs import known_chunks
from torpor.image.store import Store
from torpor.image.unpack import index_layer, open_layout, read_index
from torpor.registry.layout import Layout

SAMPLE_EVERY = 4            # compress one new chunk in this many to learn the ratio
FILE_SAMPLE = 8 << 20       # bytes of files compressed to learn a tree's ratio
PER_CHUNK_OVERHEAD = 100    # a new chunk's row in its pack's own index
INDEX_BYTES_PER_CHUNK = 52  # a chunk's row in the chunk index, compressed (bench/generations.py)
SMALL_IMAGES = 24 << 10     # CRIU's images of one process besides its pages, compressed
DOCUMENTS = 12 << 10        # checkpoint.json, torpor's state layer, configs and manifests
ESTIMATES_DIR = "estimates"


@dataclass(frozen=True)
class _PreviousChunks:
    ref: str
    index_digest: str
    created: float              # seconds since the epoch
    stored: dict[str, int]      # chunk digest -> its stored (compressed) length
    chunks: int                 # in its chunk index
    index_bytes: int            # its chunk index blob
    small_images: int           # stored bytes of CRIU's images other than pages-*.img
    documents: int              # its state layer, metadata, configs and manifests


def record_path(cfg: Config, namespace: str, container_id: str) -> str:
    return os.path.join(cfg.runtime_state_dir, ESTIMATES_DIR, namespace, f"{container_id}.json")


def saved_estimate(cfg: Config, namespace: str, container_id: str) -> Estimate | None:
    """The last estimate of a container, if one was made and is readable."""
    path = record_path(cfg, namespace, container_id)
    try:
        with open(path, "rb") as f:
            return Estimate.loads(f.read(), path)
    except (OSError, FormatError):
        return None


def estimate(client: Client, container_id: str, cfg: Config) -> Estimate:
    started = time.monotonic()
    # 1. the container, its processes
    container = client.get_container(container_id)
    try:
        task = client.get_task(container_id).process
    except NotFound:
        raise CheckpointError(f"container {container_id} has no running task") from None
    if task.status not in (RUNNING, PAUSED):
        raise CheckpointError(f"the task of {container_id} is not running")
    pids = Cgroup.of_pid(task.pid).pids() or [task.pid]
    # 2. the previous generation
    previous = _previous(client, Store(cfg.image_store), container_id, container.image)
    since = previous.created if previous else None
    # 3.-6. the parts
    spec = json.loads(container.spec.value) if container.spec.value else {}
    mem = _memory(pids, previous)
    parts = [mem, _rootfs(task.pid, since), *_volumes(spec, cfg, since),
             _gpu(cfg, pids), _metadata(len(pids), mem, previous)]
    result = Estimate(container_id, client.namespace,
                      timestamps.now(),
                      previous.index_digest if previous else "", previous.ref if previous else "",
                      tuple(p for p in parts if p is not None), time.monotonic() - started)
    # 7. kept for the next checkpoint
    path = record_path(cfg, client.namespace, container_id)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_atomic(path, result.dumps(), mode=0o600, durable=False)
    return result


def _previous(client: Client, store: Store, container_id: str,
              image_name: str) -> _PreviousChunks | None:
    index_digest = None
    if image_name:
        try:
            index_digest = client.get_image(image_name).labels.get(ann.IMAGE_CHECKPOINT)
        except ContainerdError:
            pass
    found = likely_previous(store, index_digest=index_digest, ref=None,
                            container_id=container_id)
    if found is None:
        return None
    try:
        image = open_layout(str(found.layout))
        layer = index_layer(image)
        if layer is None:
            return None
        chunks: ChunkIndex = read_index(Layout(found.layout), layer)
    except (ImageError, OSError):
        return None
    stored = {digest: where.length for digest, where in known_chunks(chunks).items()}
    created = _epoch(found.created) or os.path.getmtime(found.layout / names.OCI_INDEX_FILE)
    small = {e for f in chunks.files if not os.path.basename(f.name).startswith("pages-")
             for e in f.extents if e >= 0}
    documents = sum(d.size for d in image.state_layers if d.media_type == mt.STATE_LAYER)
    config = image.state_manifest.get("config", {}).get("size", 0)
    documents += image.index.size + image.state.size + image.runnable.size + \
        image.runnable_blobs[0].size + (config if isinstance(config, int) else 0)
    return _PreviousChunks(found.ref, found.index_digest, created, stored, len(chunks.chunks),
                           layer.size, sum(chunks.chunks[e].length for e in small), documents)


def _epoch(iso: str) -> float | None:
    return timestamps.epoch(iso)


class _MemoryTally:
    """Chunks as they come: distinct ones counted once, stored ones at their stored size, a
    sample of new ones compressed."""

    def __init__(self, stored: dict[str, int]) -> None:
        self.stored = stored
        self.zstd = compressor()
        self.seen: set[str] = set()
        self.raw = self.known_full = self.new_plain = self.new_chunks = 0
        self.sampled_plain = self.sampled_stored = 0

    def add(self, chunk: tuple[str, int, bytes | None] | None) -> None:
        if chunk is None or chunk[0] in self.seen:
            return
        digest, length, data = chunk
        self.seen.add(digest)
        self.raw += length
        if digest in self.stored:
            self.known_full += self.stored[digest]
            return
        if self.new_chunks % SAMPLE_EVERY == 0 and data is not None:
            self.sampled_plain += length
            self.sampled_stored += len(self.zstd.compress(data))
        self.new_plain += length
        self.new_chunks += 1

    @property
    def ratio(self) -> float:
        return self.sampled_stored / self.sampled_plain if self.sampled_plain else 1.0


def _memory(pids: Iterable[int], previous: _PreviousChunks | None) -> EstimatePart:
    tally = _MemoryTally(previous.stored if previous else {})
    for pid in pids:
        chunker = StreamChunker(params_of(None), keep_data=True)
        try:
            for page in memory.dump_pages(pid):
                tally.add(chunker.page(page))
        except CheckpointError:
            continue  # the process ended meanwhile
        tally.add(chunker.finish())
    new = int(tally.new_plain * tally.ratio) + tally.new_chunks * PER_CHUNK_OVERHEAD
    detail = (f"{len(tally.seen)} chunks, {tally.new_chunks} new" if previous else
              f"{len(tally.seen)} chunks, no previous generation") + \
        f", new chunks compress to {tally.ratio:.2f}"
    return EstimatePart("memory", tally.raw, tally.known_full + new, new, detail)


def _tree(root: str) -> tuple[int, float, float]:
    """(tar bytes, compression ratio of a sample, newest ctime) of everything below `root`."""
    size = 0
    newest = 0.0
    sample = bytearray()
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in [*dirs, *sorted(files)]:
            path = os.path.join(directory, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            newest = max(newest, st.st_ctime, st.st_mtime)
            size += 512
            if os.path.isfile(path) and not os.path.islink(path):
                size += -(-st.st_size // 512) * 512
                if len(sample) < FILE_SAMPLE:
                    try:
                        with open(path, "rb") as f:
                            sample += f.read(FILE_SAMPLE - len(sample))
                    except OSError:
                        pass
    size += 1024
    ratio = len(compressor().compress(bytes(sample))) / len(sample) if sample else 1.0
    return size, min(1.0, ratio), newest


def _rootfs(pid: int, since: float | None) -> EstimatePart | None:
    overlay = rootfs.root_overlay(pid)
    if overlay is None:
        return EstimatePart("rootfs", 0, 0, 0, "not an overlay mount: not estimated")
    size, ratio, newest = _tree(overlay["upperdir"])
    full = int(size * ratio)
    changed = since is None or newest > since
    return EstimatePart("rootfs", size, full, full if changed else 0,
                        "changed since the previous generation" if since and changed else
                        "unchanged since the previous generation" if since else "")


def _volumes(spec: dict[str, object], cfg: Config, since: float | None) -> list[EstimatePart]:
    policy = file_policy.choose_policy(None, spec, cfg)
    try:
        chosen, shm = volume_io.select(spec, policy.volumes, policy.dev_shm)
    except CheckpointError:
        return []
    parts = []
    for volume in [*chosen, *([shm] if shm else [])]:
        if volume.kind == "dir":
            size, ratio, newest = _tree(volume.source)
        else:
            st = os.stat(volume.source)
            size, ratio, newest = 1536 + st.st_size, 1.0, max(st.st_ctime, st.st_mtime)
        full = int(size * ratio)
        changed = since is None or newest > since
        parts.append(EstimatePart("volumes", size, full, full if changed else 0,
                                  volume.destination))
    return parts


def _gpu(cfg: Config, pids: list[int]) -> EstimatePart | None:
    try:
        from torpor.gpu import inventory
    except ImportError:
        return None
    try:
        found = inventory.gather_or_none(cfg.gpu_nvml_library, cfg.gpu_cuda_library, pids)
    except Exception:
        return None
    if found is None or not found.processes:
        return None
    used = sum(p.used_memory for p in found.processes)
    return EstimatePart("gpu", used, used, used,
                        "device memory, brought into host memory at checkpoint; the new bytes "
                        "are an upper bound (compared only then)")


def _metadata(processes: int, mem: EstimatePart,
              previous: _PreviousChunks | None) -> EstimatePart:
    """The chunk index, CRIU's images besides the pages, torpor's state and the documents: as
    large as the previous generation's (the index scaled to the chunks now), all new, since
    they change with every checkpoint; or from typical sizes for a first one."""
    chunks = max(1, mem.raw_bytes // (128 << 10))
    if previous is None:
        size = chunks * INDEX_BYTES_PER_CHUNK + processes * SMALL_IMAGES + DOCUMENTS
        return EstimatePart("metadata", size, size, size,
                            "the chunk index, CRIU's small images, torpor's state (typical)")
    index = previous.index_bytes * chunks // max(1, previous.chunks)
    size = index + previous.small_images + previous.documents
    return EstimatePart("metadata", size, size, size,
                        "the chunk index, CRIU's small images, torpor's state (as the "
                        "previous generation's)")
