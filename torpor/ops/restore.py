"""`torpor restore SOURCE`: a container back from a checkpoint, whole or not at all.

SOURCE is a checkpoint directory, an OCI layout, a kubelet checkpoint archive (made a checkpoint
directory in scratch space first, ops/kube.py), a local image (`torpor ls`) or an image in a
registry. Steps, in order (an ExitStack undoes each if a later one fails: no container, task,
snapshot or scratch directory is left):
 1. find the checkpoint and read its metadata (a registry: the index, checked against the
    node's signature policy first (torpor.signing), then the manifests and metadata only; an
    encrypted image's metadata layer into scratch space), within the limits of
    `[restore]` (layer count, document sizes, what the layers unpack to); a checkpoint
    directory must hold exactly the files its metadata lists;
 2. check this node against it: architecture, kernel, CPU features, CRIU, runc, cgroups, GPUs;
    and that the decryption keys open every encrypted layer; before any layer is downloaded;
 3. the policy: the checkpoint's spec, rewritten for this restore, against this node's restore
    policy and what the user granted (capture.restore_policy): hooks, host mounts, devices,
    capabilities, namespaces, the root path; refused before anything is created;
 4. registry only: link the layers the local store already holds (packs of earlier
    generations), download the others into it, every blob digest-checked;
 5. images only: unpack the state layers into scratch space (the CRIU images; encrypted layers
    decrypted there) and import the runnable image (base layers + the read-write layer) into
    containerd;
 6. CRIU's images against the spec and the policy (torpor.criu_images: credentials, seccomp,
    namespaces, files, sockets, mounts, ttys); the root filesystem: a snapshot of the image,
    plus the read-write layer for directories;
 7. the container: the checkpoint's spec (cgroup path, network namespace and volume sources
    rewritten for the new name and node), runtime io.containerd.runc.v2 with BinaryName = this
    node's torpor-runc;
 8. the task from the CRIU images (criu_image_path), repeating BinaryName in the task options
    because containerd does not merge them with the container's, with a stdin FIFO (so that the
    restored init's fd 0 is a pipe a later checkpoint can dump) and the grant record that
    torpor-runc checks the spec against again; Tasks.Start runs torpor-runc restore, which puts
    back the CRIU flags, network, volumes and GPU state.
Each step has a deadline, `[restore] timeout_s` plus 10 s per GiB it handles (torpor.deadlines):
unpacking and reading run under SIGALRM, containerd's task calls under gRPC deadlines a little
longer than the one torpor-runc keeps for runc and CRIU (it kills them and the half-restored
container), so the error comes from where the restore stood, and the undo runs.
The checkpoint itself is only read.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torpor import criu_images, signing, tally
from torpor.capture import deadlines, pod, processes, restore_policy
from torpor.config import Config
from torpor.containerd import images as containerd_image
from torpor.containerd import runtime as runc_runtime
from torpor.containerd import snapshots
from torpor.containerd.api import containers_pb2, tasks_pb2
from torpor.containerd.client import Client
from torpor.errors import AlreadyExists, ContainerdError, ImageError, NotFound, RestoreError
from torpor.formats import annotations as ann
from torpor.formats import names
from torpor.formats.metadata import BaseImage, CheckpointMetadata, RuntimeInfo
from torpor.formats.node import NodeFacts
from torpor.formats.oci import OciSpec
from torpor.formats.spec_requests import (
    TORPOR_HOOK_ARG0,
    TORPOR_HOOK_STAGES,
    SpecRequests,
    matches,
)
from torpor.image import directory as checkpoint_dir
from torpor.image import kube_archive, unpack
from torpor.image.encryption_keys import DecryptionKey, node_keys
from torpor.image.store import Store
from torpor.lazy import progress as lazy_progress
from torpor.node import compat
from torpor.node import runtime as runtime_tools
from torpor.ops import generation, kube, own_files, streamed_pull
from torpor.ops.access import RegistryAccess
from torpor.ops.sources import (
    SourceKind,
    check_download_space,
    image_of_plan,
    kind_of,
    registry_options,
)
from torpor.registry import fetch_metadata
from torpor.registry.layout import Layout
from torpor.reporting import SILENT, Progress

if TYPE_CHECKING:
    from torpor.lazy.chunks import RemoteRange
    from torpor.lazy.keep import Fetch
    from torpor.lazy.session import LazyMemory
    from torpor.registry.arrivals import Arrivals
    from torpor.registry.pull import PullPlan


@dataclass(frozen=True)
class RestoreOptions:
    name: str | None = None               # default: the checkpointed container's name
    netns: str | None = None              # restore into this network namespace (a path)
    add_addresses: bool = False           # add the addresses sockets need to that namespace
    volumes: dict[str, str] = field(default_factory=dict)   # destination -> new host source
    accept_mounts: frozenset[str] = frozenset()   # destinations whose host source is accepted
    allow_spec_hooks: bool = False        # run the hooks the checkpoint's spec names
    decryption_keys: tuple[DecryptionKey, ...] = ()
    log_uri: str | None = None            # the task's stdout/stderr (default: a file)
    runtime_binary: str | None = None     # torpor-runc on this node
    runc_root: str = ""                   # runc's state root (default: the shim's own)
    lazy: bool | None = None              # memory after the workload runs (default [restore] lazy)
    registry: RegistryAccess = field(default_factory=RegistryAccess)


@dataclass(frozen=True)
class RestoreResult:
    name: str
    pid: int
    namespace: str
    log: str
    source: str
    timings: dict[str, float]
    downloaded_bytes: int = 0   # fetched from a registry (a lazy restore's ranges included)
    local_bytes: int = 0        # taken from this node: its store, a layout, directory, archive

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Moved:
    """The checkpoint's bytes a restore fetched from a registry, and took from this node."""

    downloaded: int = 0
    local: int = 0


def layer_bytes(image: unpack.CheckpointImage, lazily: bool) -> int:
    """A local image's blobs that a restore reads, once per digest (a lazy one's packs are
    counted as the page source reads them)."""
    blobs = {d.digest: d.size for d in (*image.state_layers, *image.runnable_blobs)
             if not (lazily and unpack.is_pack(d))}
    return sum(blobs.values())


@dataclass(frozen=True)
class ApprovedSpec:
    """The spec the container is created with, and what of it the policy granted."""

    spec: OciSpec
    requests: SpecRequests
    own_files: str = ""     # a directory of sandbox files torpor made for this restore


def approve(metadata: CheckpointMetadata, options: RestoreOptions, cfg: Config,
            namespace: str, claims: own_files.Claims) -> ApprovedSpec:
    """Step 3: the checkpoint's spec for this restore, as it will be created, checked against
    the node's policy. A Kubernetes pod's container restored on its own first gets namespaces,
    sandbox files and /dev/shm of its own, any other container its engine's /etc/hosts,
    /etc/hostname and /etc/resolv.conf (capture/pod.py): files torpor makes, allowed as such,
    and removed again if the policy refuses the rest."""
    unpack.ensure_restorable(metadata)
    name = names.check_identifier(options.name or metadata.container.id, "the container name")
    names.check_identifier(namespace, "the containerd namespace")
    spec = rewrite_spec(metadata.container.spec, metadata.container.id, name, options)
    # one directory per restore: a container of the same name may be using its own
    files = os.path.join(own_files.root(cfg), f"{namespace}-{name}-{secrets.token_hex(8)}")
    claims.claim(files, namespace, name)  # removed if the restore fails, swept once unmounted
    if pod.in_pod(spec):
        spec = pod.standalone(spec, files, network_given=bool(options.netns))
    else:  # the engine's own files (nerdctl's /etc/hosts...) become torpor's
        spec = pod.own_engine_files(spec, files, frozenset(options.volumes))
    if claims.drop_if_unused(files):
        files = ""
    policy = restore_policy.RestorePolicy.of(cfg)
    user_annotations = frozenset({ann.RESTORE_ADD_ADDRESSES} if options.add_addresses else ())
    restore_policy.admit_annotations(spec, policy, keep=user_annotations)
    requests = SpecRequests.of(spec)
    grants = restore_policy.UserGrants(
        spec_hooks=options.allow_spec_hooks,
        mounts=frozenset(options.volumes) | options.accept_mounts, netns=options.netns,
        own_sources=(files,) if files else (), annotations=user_annotations)
    restore_policy.check(requests, policy, grants)
    return ApprovedSpec(spec, requests, files)


def restore(client: Client, source: str, options: RestoreOptions, cfg: Config,
            progress: Progress = SILENT) -> RestoreResult:
    with contextlib.suppress(OSError):   # earlier restores' files whose container is gone
        own_files.sweep(client, cfg)
    with own_files.claims() as claims:   # what this one makes goes if it fails
        result = _restore(client, source, options, cfg, progress, claims)
    tally.add("downloaded", result.downloaded_bytes)
    tally.add("local", result.local_bytes)
    return result


def keys_for(image: unpack.CheckpointImage, options: RestoreOptions,
             cfg: Config) -> tuple[DecryptionKey, ...]:
    """--decryption-key, and for an encrypted image the node's own ([restore] decryption_keys):
    a plain image never reads the node's key files."""
    if not image.encrypted:
        return options.decryption_keys
    return node_keys(cfg, options.decryption_keys)


def _restore(client: Client, source: str, options: RestoreOptions, cfg: Config,
             progress: Progress, claims: own_files.Claims) -> RestoreResult:
    started = time.monotonic()
    timings: dict[str, float] = {}
    moved = Moved()
    store = Store(cfg.image_store)
    limits = unpack.ImageLimits.of(cfg)
    keys = options.decryption_keys    # and, for an encrypted image, the node's (keys_for)
    kind = kind_of(source, store)
    if options.name is not None:   # before anything is read, downloaded or unpacked
        name_free(client, options.name)
    node = this_node_ahead(client, options)   # asked while the checkpoint is read
    if options.lazy and kind in (SourceKind.DIRECTORY, SourceKind.KUBE_ARCHIVE):
        raise RestoreError(f"{source} cannot be restored lazily: only a checkpoint image "
                           "(local or in a registry) holds its memory as chunks to serve",
                           hint="restore it without --lazy, or from its image (torpor push)")
    if kind is SourceKind.DIRECTORY:
        # 1. the directory, every file checked, 2. this node, 3. the policy
        progress.step(f"checking {os.path.abspath(source)}")
        with _deadline(cfg, f"reading the checkpoint {os.path.abspath(source)}"):
            metadata = checkpoint_dir.load(source, max_files=limits.max_files)
        if options.name is None:
            name_free(client, metadata.container.id)
        compat.check(metadata, cfg, node.result())
        approved = approve(metadata, options, cfg, client.namespace, claims)
        moved.local = metadata.sizes.total
        return _restore_directory(client, os.path.abspath(source), metadata, approved, options,
                                  cfg, progress, started, source, timings, moved,
                                  name_checked=True)
    if kind is SourceKind.KUBE_ARCHIVE:
        with store.scratch() as scratch:
            progress.step(f"reading the kubelet checkpoint {os.path.abspath(source)}")
            directory = str(scratch / "checkpoint")
            with _deadline(cfg, f"reading the kubelet checkpoint {source}"):
                found = kube_archive.read(source)
                if options.name is None:   # before the archive is unpacked
                    name_free(client, found.config.id)
                metadata = kube.to_directory(client, found, directory, progress)
            approved = approve(metadata, options, cfg, client.namespace, claims)
            moved.local = os.path.getsize(source)
            return _restore_directory(client, directory, metadata, approved, options, cfg,
                                      progress, started, source, timings, moved)

    ref: str | None = None
    with store.scratch() as scratch, contextlib.ExitStack() as downloading:
        if kind is SourceKind.REGISTRY:
            ref = source
            # 1. the image's metadata, 2. this node and the keys, 3. the policy, 4. the layers
            progress.step(f"fetching {source}'s index and metadata")
            signed: list[signing.SignatureCheck] = []   # checked on the index, first
            with fetch_metadata(source, registry_options(cfg, source, options.registry),
                                signing.checker(cfg, source, signed)) as plan:
                progress.step(signed[0].describe())
                image = image_of_plan(plan, limits)
                if options.name is None:
                    name_free(client, image.metadata.container.id)
                progress.step("checking this node against the checkpoint")
                compat.check(image.metadata, cfg, node.result())
                keys = keys_for(image, options, cfg)
                unpack.check_keys(image, keys)
                check_download_space(plan, cfg)
                metadata_layout = str(scratch / "metadata")
                wanted = [layer for layer in plan.layers
                          if layer.descriptor == image.metadata_layer]
                if wanted:   # an encrypted image's whole metadata: one small layer, first
                    moved.downloaded += plan.download(metadata_layout, wanted).bytes_downloaded
                metadata = unpack.full_metadata(image, metadata_layout, keys, str(scratch),
                                                limits)
                approved = approve(metadata, options, cfg, client.namespace, claims)
                t = time.monotonic()
                layout = str(scratch / "layout")
                lazy = lazy_memory(source, image, options, cfg, store, plan.read_range,
                                   (layout, packs_into(plan, layout)))
                if lazy is not None:   # all but the packs: they come behind the workload
                    downloading.callback(lazy.stop)   # ended before the scratch is removed
                    layers = [la for la in plan.layers if not unpack.is_pack(la.descriptor)]
                    progress.step(f"downloading {len(layers)} layers; the memory comes lazily")
                    moved.downloaded += plan.download(
                        layout, layers, progress=progress.transfer("downloaded")).bytes_downloaded
                else:
                    with store.downloading(plan.top.descriptor.digest, progress.step), \
                            store.staging(source) as staged:  # the previous copy stays till whole
                        held = generation.hold_for_pull(plan, store, scratch / "held")
                        layers = generation.place_for_pull(plan, held, staged)  # the store has them
                        progress.step(f"downloading {len(layers)} layers "
                                      f"({len(held)} already here)")
                        if streamed_pull.streams(image):
                            moved.downloaded += streamed_pull.download_unpacking(
                                plan, str(staged), layers, image, str(scratch / "checkpoint"),
                                keys, limits, metadata, progress,
                                deadlines.budget(cfg.restore_timeout_s, metadata.sizes.total)
                                if cfg.restore_timeout_s > 0 else 0)
                        else:
                            moved.downloaded += plan.download(
                                staged, layers,
                                progress=progress.transfer("downloaded")).bytes_downloaded
                        moved.local = sum(la.descriptor.size for la in plan.layers
                                          if la.descriptor.digest in held)
                    layout = str(store.layout(source))
                timings["pull_s"] = time.monotonic() - t
        else:
            if kind is SourceKind.STORE:
                ref, layout = source, str(store.layout(source))
            else:
                layout = source
            image = unpack.open_layout(layout, limits=limits)
            if options.name is None:
                name_free(client, image.metadata.container.id)
            compat.check(image.metadata, cfg, node.result())
            keys = keys_for(image, options, cfg)
            unpack.check_keys(image, keys)
            # 3. the policy, on the whole metadata (an encrypted checkpoint's, decrypted)
            metadata = unpack.full_metadata(image, layout, keys, str(scratch), limits)
            approved = approve(metadata, options, cfg, client.namespace, claims)
            lazy = lazy_memory(source, image, options, cfg, store, None)
            moved.local = layer_bytes(image, lazily=lazy is not None)
        name = ref or f"torpor.local/checkpoint/{image.metadata.container.id}:" \
                      f"{image.index.digest.split(':')[1][:12]}"
        # 5. the CRIU images into scratch (done already where they streamed in), the runnable
        #    image into containerd
        t = time.monotonic()
        directory = str(scratch / "checkpoint")
        if not os.path.exists(directory):
            progress.step("unpacking the CRIU images")
            with _deadline(cfg, "unpacking the CRIU images", metadata.sizes.total):
                unpack.unpack_state(image, layout, directory, keys=keys, limits=limits,
                                    metadata=metadata, lazy=lazy)
        with client.lease():
            progress.step(f"importing the runnable image {name} into containerd")
            with _deadline(cfg, f"importing the runnable image {name}",
                           metadata.sizes.rootfs_diff):
                chain = unpack.import_runnable(client, image, layout, name, keys, str(scratch))
            timings["unpack_s"] = time.monotonic() - t
            with _deadline(cfg, "reading the unpacked checkpoint"):
                metadata = checkpoint_dir.load(directory, max_files=limits.max_files)
            result = _restore_directory(client, directory, metadata, approved, options, cfg,
                                        progress, started, source, timings, moved,
                                        rootfs_image=chain, lazy=lazy)
        if lazy is not None and lazy.download is not None and ref is not None:
            extra = keep_lazily_fetched(lazy, store, ref, image, layout, progress, timings)
            result = replace(result, downloaded_bytes=result.downloaded_bytes + extra)
        return result


def packs_into(plan: PullPlan, layout: str) -> Fetch:
    """How a lazy restore downloads its packs into `layout`, behind the workload."""
    def fetch(digests: Sequence[str], arrivals: Arrivals) -> None:
        layers = {la.descriptor.digest: la for la in plan.layers}
        plan.download(layout, [layers[d] for d in digests], arrivals=arrivals)
    return fetch


def keep_lazily_fetched(lazy: LazyMemory, store: Store, ref: str, image: unpack.CheckpointImage,
                        layout: str, progress: Progress, timings: dict[str, float]) -> int:
    """The image a lazy restore fetched into this node's store, as a restore that downloads it
    whole stores it: the next restore of it, or of its next generation, reads the packs here.
    The workload already has all its memory, so nothing here may fail the restore: a failure,
    an interrupt, an image missing a blob or a newer copy of `ref` already stored is said,
    and the image is not stored. The bytes its packs' download brought."""
    progress.step(f"storing {ref} on this node for the next restore")
    t = time.monotonic()
    try:
        extra = lazy.keep()
        timings["packs_downloaded_bytes"] = extra
        blobs = Layout(Path(layout))
        missing = [d.digest for d in (*image.state_layers, *image.runnable_blobs)
                   if not _blob_here(blobs, d.digest, d.size)]
        if missing:
            raise ImageError(f"blobs {', '.join(missing)} are not in the image's layout")
        stored = next((e.digest for e in store.entries() if e.ref == ref), None)
        if stored not in (None, image.index.digest):
            raise ImageError(f"this node's store already holds another {ref} ({stored})")
        store.install(ref, Path(layout))
    except BaseException as e:   # the restore is done: even an interrupt only skips this
        lazy.stop()
        progress.step(f"{ref} was restored but not stored on this node: "
                      f"{e or type(e).__name__}")
        return lazy.downloaded_bytes
    timings["keep_s"] = time.monotonic() - t
    return extra


def _blob_here(layout: Layout, digest: str, size: int) -> bool:
    try:
        return layout.blob_path(digest).stat().st_size == size
    except OSError:
        return False


def lazy_memory(source: str, image: unpack.CheckpointImage, options: RestoreOptions,
                cfg: Config, store: Store, remote: RemoteRange | None,
                download: tuple[str, Fetch] | None = None) -> LazyMemory | None:
    """The page source of a lazy restore (torpor.lazy), when one is asked for (--lazy, or
    `[restore] lazy`) and the image allows it; packs are read from this node's store where it
    holds them, else from their `download` (a layout, and how) as it comes, or by range
    requests (`remote`). An image that cannot be restored lazily is an error when --lazy asked
    for it, restored whole when only the node's default did."""
    if not (options.lazy if options.lazy is not None else cfg.restore_lazy):
        return None
    why = ("its memory is CRIU's tar parts, not chunks" if unpack.index_layer(image) is None
           else "its packs are encrypted (a range of one cannot be decrypted alone)"
           if image.encrypted else "")
    if why:
        if options.lazy:
            raise RestoreError(f"{source} cannot be restored lazily: {why}",
                               hint="restore it without --lazy")
        return None
    from torpor.lazy.session import LazyMemory

    def here(digest: str, size: int) -> str | None:
        found = store.find_blob(digest, size)
        return str(found) if found is not None else None

    return LazyMemory(here, remote, download, image.index.digest)


def this_node_ahead(client: Client, options: RestoreOptions) -> Future[NodeFacts]:
    """This node as the restored container's runtime sees it: the runc and CRIU that the shim
    runs through this restore's torpor-runc, on containerd's PATH (node/runtime.py); asked on
    a thread of its own, from now."""
    binary = options.runtime_binary or default_runtime_binary()
    return runtime_tools.gather_ahead(client.address,
                                      RuntimeInfo(runc_runtime.RUNC_SHIM, binary))


def name_free(client: Client, name: str) -> None:
    """The container name is valid and not taken: known before any layer is downloaded,
    unpacked or imported, and again just before the container is created."""
    names.check_identifier(name, "the container name")
    try:
        client.get_container(name)
    except NotFound:
        return
    raise AlreadyExists(f"container {name} already exists",
                        hint="restore under another --name, or delete it first")


def _restore_directory(client: Client, directory: str, metadata: CheckpointMetadata,
                       approved: ApprovedSpec, options: RestoreOptions, cfg: Config,
                       progress: Progress, started: float, source: str,
                       timings: dict[str, float], moved: Moved,
                       rootfs_image: BaseImage | None = None,
                       lazy: LazyMemory | None = None,
                       name_checked: bool = False) -> RestoreResult:
    """Steps 6 to 8 from a checkpoint directory. `rootfs_image` is an image in containerd that
    already holds the read-write layer (a checkpoint image's runnable manifest); without it,
    the base image plus the directory's rootfs-diff.tar are used. `name_checked`: the caller
    has just found the name free (a directory's restore: nothing slow came between)."""
    original = metadata.container
    name = options.name or original.id
    if not name_checked:
        name_free(client, name)
    snapshotter = original.snapshotter or "overlayfs"
    image = rootfs_image or _base_image(client, metadata, progress)
    spec = approved.spec
    runtime = RuntimeInfo(name=runc_runtime.RUNC_SHIM,
                          binary_name=options.runtime_binary or default_runtime_binary(),
                          # the user's or the shim's runc root: a checkpoint names no host path
                          root=options.runc_root,
                          systemd_cgroup=original.runtime.systemd_cgroup)
    work = os.path.join(cfg.runtime_state_dir, "restore-work",
                        f"{client.namespace}-{name}-{secrets.token_hex(16)}")
    log_uri = options.log_uri or _default_log_uri(cfg, client.namespace, name)
    with contextlib.ExitStack() as undo, client.lease():
        # CRIU's images against the spec, before anything is created
        progress.step("checking the CRIU images")
        t = time.monotonic()
        criu_images.check(os.path.join(directory, names.CRIU_DIR), spec, cfg)
        timings["check_images_s"] = time.monotonic() - t
        # 6. the root filesystem
        containerd_image.ensure_unpacked(client, snapshotter, image)
        progress.step("preparing the container's root filesystem")
        mounts = client.prepare_snapshot(snapshotter, name, image.chain_id)
        undo.callback(_quietly, client.remove_snapshot, snapshotter, name)
        diff = os.path.join(directory, names.ROOTFS_DIFF)
        if rootfs_image is None and os.path.exists(diff) and os.path.getsize(diff) > 0:
            with _deadline(cfg, "applying the read-write layer", os.path.getsize(diff)):
                snapshots.apply_rw_layer(client, diff, mounts)
        # 7. the container
        # the checkpoint's labels only where the policy names them: containerd's restart
        # monitor acts on containerd.io/restart.* (a binary:// log URI runs a host program),
        # nerdctl on nerdctl/* (its state directory, removed with the container)
        labels = {**{k: v for k, v in original.labels.items() if matches(k, cfg.restore_labels)},
                  ann.RESTORED_FROM: directory}
        client.create_container(containers_pb2.Container(
            id=name, image=image.name, labels=labels, snapshotter=snapshotter,
            snapshot_key=name,
            runtime=containers_pb2.Container.Runtime(name=runtime.name,
                                                     options=runc_runtime.runc_options(runtime)),
            spec=runc_runtime.pack_any(runc_runtime.SPEC_TYPE_URL, json.dumps(spec).encode())))
        undo.callback(_quietly, client.delete_container, name)
        # 8. the task, from the CRIU images, with what the policy granted
        os.makedirs(work, mode=0o700, exist_ok=True)
        undo.callback(shutil.rmtree, work, True)
        grant = restore_policy.write_grant(work, approved.requests)  # torpor-runc's --work-path
        undo.callback(_quietly, os.unlink, grant)
        pages = None
        if lazy is not None:   # the page source first: torpor-runc finds its socket in `work`
            lazy.give_up_at = time.monotonic() + deadlines.budget(
                cfg.restore_timeout_s or 300, lazy.lazy_bytes)
            progress.step(f"starting the page source ({lazy.lazy_bytes >> 20} MiB lazily)")
            criu = runtime_tools.tools(client.address, runtime).criu or "criu"
            pages = lazy.start(work, criu, _cgroup_dirs(spec))
            undo.callback(pages.close)   # after the task is gone: the socket closes last
        progress.step("restoring the task (torpor-runc, CRIU)")
        t0 = time.monotonic()
        limit = task_deadline(cfg, directory)
        outer = limit + RUNTIME_SLACK_S if limit else None
        client.create_task(tasks_pb2.CreateTaskRequest(
            container_id=name, rootfs=mounts, stdin=_stdin_fifo(work), stdout=log_uri,
            stderr=log_uri,
            options=runc_runtime.runc_options(
                runtime, criu_image_path=os.path.join(directory, names.CRIU_DIR),
                criu_work_path=work)), timeout=limit)
        undo.callback(_remove_task, client, name)
        try:
            pid = client.start_task(name, timeout=outer)
        except Exception as e:
            kept = _keep_restore_log(cfg, client.namespace, name, work)
            if isinstance(e, ContainerdError) and "deadline exceeded" in str(e).lower():
                e = RestoreError(f"Tasks.Start (torpor-runc restore, runc, CRIU) did not "
                                 f"finish within {outer or 0:.0f}s")
            raise RestoreError(f"restoring {name} failed: {e}",
                               hint=f"CRIU's log: {kept}" if kept else None) from None
        timings["restore_s"] = time.monotonic() - t0
        if pages is not None:
            timings["running_s"] = time.monotonic() - started
            pages.running(pid)
            progress.step(f"{name} runs; its memory is arriving")
            track = _tracker(cfg, client.namespace, name, source, pages.memory)
            undo.callback(lazy_progress.remove, cfg.runtime_state_dir, client.namespace, name)
            done = pages.wait(progress.step, track=track)
            lazy_progress.remove(cfg.runtime_state_dir, client.namespace, name)
            timings.update(lazy_s=done.complete_s, lazy_remote_bytes=done.remote_bytes,
                           lazy_streamed_bytes=done.streamed_bytes,
                           lazy_local_bytes=done.local_bytes)
            moved.downloaded += done.remote_bytes
            moved.local += done.local_bytes
        undo.pop_all()
    if pages is not None:
        pages.close()
    shutil.rmtree(work, ignore_errors=True)
    _quietly(os.unlink, grant)
    timings["total_s"] = time.monotonic() - started
    return RestoreResult(name, pid, client.namespace, log_uri, source, timings,
                         moved.downloaded, moved.local)


def _tracker(cfg: Config, namespace: str, name: str, source: str,
             memory: LazyMemory) -> Callable[[int, int, int], None]:
    """What `torpor ls`, `torpor inspect` and torpord show of this lazy restore
    (torpor.lazy.progress)."""
    started, me = time.time(), processes.start_time(os.getpid())
    lazy_bytes = memory.lazy_bytes   # a sum over the pagemaps: once, not every second

    def track(placed: int, remote: int, local: int) -> None:
        with contextlib.suppress(OSError):
            lazy_progress.write(cfg.runtime_state_dir, lazy_progress.LazyProgress(
                namespace, name, source, lazy_bytes, placed, remote, local, started,
                os.getpid(), me, memory.digest))

    track(0, 0, 0)
    return track


def _cgroup_dirs(spec: OciSpec) -> list[str]:
    """Where the container's processes will be, on cgroup v1 (freezer) and v2: the guard's
    (torpor.lazy.guard), should torpor die before their task is known. A cgroupfs path as it
    is; systemd's slice:prefix:name as systemd lays it out (a-b.slice under a.slice)."""
    path = str((spec.get("linux") or {}).get("cgroupsPath") or "")
    if path.startswith("/") and ":" not in path:
        relative = path.lstrip("/")
    elif path.count(":") == 2:
        unit_slice, prefix, name = path.split(":")
        unit_slice = unit_slice or "system.slice"
        words = unit_slice.removesuffix(".slice").split("-")
        slices = [f"{'-'.join(words[:n])}.slice" for n in range(1, len(words) + 1)]
        relative = os.path.join(*slices, f"{prefix}-{name}.scope" if prefix else name)
    else:
        return []
    return [os.path.join("/sys/fs/cgroup/freezer", relative),
            os.path.join("/sys/fs/cgroup", relative)]


RUNTIME_SLACK_S = 30.0  # containerd's deadline on Tasks.Start, past torpor-runc's on runc


def task_deadline(cfg: Config, directory: str) -> float | None:
    """How long runc restore and CRIU may take for the CRIU images in `directory`."""
    if cfg.restore_timeout_s <= 0:
        return None
    return deadlines.budget(cfg.restore_timeout_s,
                            deadlines.tree_bytes(os.path.join(directory, names.CRIU_DIR)))


def _deadline(cfg: Config, what: str, size: int = 0) -> contextlib.AbstractContextManager[None]:
    """A step of this process within `[restore] timeout_s` (plus 10 s per GiB of `size`)."""
    return deadlines.step(what, deadlines.budget(cfg.restore_timeout_s, size)
                          if cfg.restore_timeout_s > 0 else 0, "[restore] timeout_s")


def _remove_task(client: Client, name: str) -> None:
    """Undo of the task: deleted; one whose runtime was cut off is killed first."""
    try:
        client.delete_task(name)
        return
    except NotFound:
        return
    except ContainerdError:
        pass
    _quietly(client.kill_task, name, 9, True)
    _quietly(client.wait_task, name, 10.0)
    _quietly(client.delete_task, name)


def _base_image(client: Client, metadata: CheckpointMetadata, progress: Progress) -> BaseImage:
    """The checkpoint's base image, present in containerd with the same layers."""
    recorded = metadata.image
    if recorded is None:
        raise RestoreError("the checkpoint records no base image")
    progress.step(f"preparing the base image {recorded.name}")
    try:
        present = containerd_image.image_chain(client, recorded.name)
    except NotFound:
        raise RestoreError(f"the base image {recorded.name} is not in containerd",
                           hint=f"pull it first (ctr images pull {recorded.name})") from None
    if present.chain_id != recorded.chain_id:
        raise RestoreError(f"the image {recorded.name} in containerd has other layers than "
                           f"the checkpoint's base ({recorded.manifest.digest})")
    return present


def rewrite_spec(spec: OciSpec, old_id: str, new_id: str, options: RestoreOptions) -> OciSpec:
    """The checkpoint's spec for the new container: its cgroup path under the new name, the
    network namespace and volume sources asked for, the add-addresses request."""
    check_shape(spec)
    spec = json.loads(json.dumps(spec))
    linux = spec.setdefault("linux", {})
    cgroups = linux.get("cgroupsPath")
    if cgroups and old_id != new_id:
        head, sep, tail = cgroups.rpartition(old_id)
        if sep and not tail.strip("/:"):
            linux["cgroupsPath"] = head + new_id + tail
    if options.netns:
        namespaces = linux.setdefault("namespaces", [])
        for ns in namespaces:
            if ns.get("type") == "network":
                ns["path"] = options.netns
                break
        else:
            namespaces.append({"type": "network", "path": options.netns})
    for mount in spec.get("mounts") or []:
        destination = str(mount.get("destination", "")).rstrip("/") or "/"
        if destination in options.volumes:
            mount["source"] = options.volumes[destination]
    # restore-time options are the user's, never the checkpoint's
    annotations = spec.setdefault("annotations", {})
    for key in [k for k in annotations if str(k).startswith(RESTORE_OPTIONS)]:
        del annotations[key]
    if options.add_addresses:
        annotations[ann.RESTORE_ADD_ADDRESSES] = "true"
    # torpor's own hooks where it writes them are the node's (torpor-runc adds them); one that
    # calls itself torpor's anywhere else stays, a request the policy refuses
    for stage, hooks in (spec.get("hooks") or {}).items():
        if stage in TORPOR_HOOK_STAGES and isinstance(hooks, list):
            spec["hooks"][stage] = [h for h in hooks if not _calls_itself_torpors(h)]
    if spec.get("process", {}).get("terminal"):
        raise RestoreError("the checkpointed container has a terminal (tty): torpor restores "
                           "containers without one")
    return spec


RESTORE_OPTIONS = "io.torpor.restore."


def _calls_itself_torpors(hook: object) -> bool:
    args = hook.get("args") if isinstance(hook, dict) else None
    return isinstance(args, list) and bool(args) and args[0] == TORPOR_HOOK_ARG0


SPEC_SHAPE: dict[str, type] = {
    "root": dict, "process": dict, "linux": dict, "hooks": dict, "annotations": dict,
    "mounts": list, "linux.namespaces": list, "linux.devices": list, "linux.resources": dict,
    "linux.cgroupsPath": str, "process.capabilities": dict}


def check_shape(spec: OciSpec) -> None:
    """RestoreError for a spec whose fields are not what the OCI runtime spec says they are."""
    for path, kind in SPEC_SHAPE.items():
        value: object = spec
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None and not isinstance(value, kind):
            what = "a list" if kind is list else "a string" if kind is str else "an object"
            raise RestoreError(f"the checkpoint's spec is malformed: {path} is not {what}")
    hostname = spec.get("hostname")
    if hostname is not None and not _is_hostname(hostname):
        raise RestoreError(f"the checkpoint's spec is malformed: hostname {str(hostname)[:80]!r} "
                           "is not a host name")
    for where in ("mounts", "linux.namespaces", "linux.devices"):
        head, _, tail = where.partition(".")
        items = spec.get(head) if not tail else (spec.get(head) or {}).get(tail)
        if any(not isinstance(item, dict) for item in items or []):
            raise RestoreError(f"the checkpoint's spec is malformed: {where} holds a non-object")


def _is_hostname(value: object) -> bool:
    """RFC 1123: labels of letters, digits and `-`, dots between them, 253 characters."""
    if not isinstance(value, str) or not 0 < len(value) <= 253:
        return False
    return all(0 < len(label) <= 63 and label.replace("-", "").isalnum() and label.isascii()
               and not label.startswith("-") and not label.endswith("-")
               for label in value.split("."))


def default_runtime_binary() -> str:
    here = os.path.join(os.path.dirname(os.path.realpath(sys.argv[0])), "torpor-runc")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("torpor-runc")
    if not found:
        raise RestoreError("torpor-runc not found on this node", hint="pass --runtime-binary")
    return os.path.abspath(found)


def _default_log_uri(cfg: Config, namespace: str, name: str) -> str:
    directory = cfg.runtime_log_dir   # absolute: torpor.config checks it on load
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return f"file://{directory}/{namespace}-{name}.log"


def _stdin_fifo(work: str) -> str:
    """A FIFO for the task's stdin, as containerd's clients give (ctr: cio's FIFOs): the shim
    then hands runc restore a pipe, which CRIU puts in place of the checkpointed fd 0. Without
    one, fd 0 is the shim's host /dev/null, outside the container's mounts, and no later
    checkpoint of the restored container can dump it. The shim opens it at Start; it can go
    with the work directory after that."""
    path = os.path.join(work, "stdin")
    os.mkfifo(path, 0o600)
    return path


def _keep_restore_log(cfg: Config, namespace: str, name: str, work: str) -> str | None:
    """Keep CRIU's restore log past the clean-up: it is where the real reason is."""
    log = os.path.join(work, "restore.log")
    if not os.path.exists(log):
        return None
    uri = _default_log_uri(cfg, namespace, name)
    kept = uri.removeprefix("file://").removesuffix(".log") + ".restore-failed.log"
    shutil.copyfile(log, kept)
    return kept


def _quietly(fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except Exception:
        pass
