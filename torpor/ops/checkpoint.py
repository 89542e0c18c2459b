"""`torpor checkpoint CONTAINER`: one container, through containerd, into a checkpoint directory
(-o DIR), a checkpoint image in the local store (-t REF), pushed (--push), or an OCI layout
(-o DIR --oci).

A checkpoint is a transaction with a journal (torpor.ops.transaction): without
--leave-running the container is stopped last, once the checkpoint is complete; any failure
before that, or a crash of this process, leaves it running as if nothing had happened, and
removes what was written. Steps, in order:
 1. one checkpoint of a container at a time (a second is refused); finish what crashed
    checkpoints left (torpor.ops.recover); read the container and its task, refuse containers
    not run by torpor-runc; with --push, find the registry's credentials now (a missing
    credential helper fails here, before the container is touched);
 2. open the journal; prepare the directory: DIR (new or empty), or scratch space in the
    local store for images;
 3. leave the request for torpor-runc in the journal (CRIU images into DIR/criu, the file
    policy): containerd forwards runc's options but no others, and the journal's work
    directory, which every runtime is given, names it;
 4. Tasks.Checkpoint under a lease: torpor-runc captures the network, GPU state and files,
    freezes the container and runs `runc checkpoint`; once CRIU's images are complete, CRIU
    holds the container (or, with --leave-running, it runs on);
 5. lay the directory out: the read-write layer beside the CRIU images (or through containerd's
    diff service for other snapshotters), CRIU's log;
 6. write checkpoint.json (container, spec, image, request, node, state, sizes, timings);
 7. images only: compress the layers (zstd, in parallel) into an OCI layout, each layer
    uploaded as soon as it is written when pushing; with recipients (--encrypt-recipient and
    the node's own, [image] encrypt_recipients), encrypt the image (image.encrypt_layout)
    before anything is uploaded (no early upload then);
 8. --push: push the manifests, then sign the index (--sign KEY, else [image] signing_key:
    torpor.signing; the key is read in step 1); -t REF: put the image in the local store,
    replacing an older REF in one rename; the index digest is recorded as this node's own;
 9. every file and directory of the checkpoint (the directory, the layout, the store's
    version) on disk (torpor.durable); commit: CRIU stops the container (without
    --leave-running); the lease and journal go.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torpor import durable, output_path, tally
from torpor.capture import journal as journals
from torpor.capture.journal import ContainerLock
from torpor.config import Config
from torpor.containerd import images as containerd_image
from torpor.containerd import runtime as runc_runtime
from torpor.containerd.api import containers_pb2
from torpor.containerd.api.task_pb2 import PAUSED, RUNNING
from torpor.containerd.client import Client
from torpor.errors import CheckpointError, NotFound, TorporError
from torpor.formats import annotations as ann
from torpor.formats import names
from torpor.formats.files import Sizes
from torpor.formats.journal import JournalTarget
from torpor.formats.request import CheckpointRequest
from torpor.image.store import Store
from torpor.ops import recover
from torpor.ops.access import RegistryAccess
from torpor.ops.checkpoint_dir import CheckpointedContainer, checkpoint_into
from torpor.ops.transaction import Transaction, signals_abort
from torpor.reporting import SILENT, Progress

if TYPE_CHECKING:
    from torpor.image.encryption_keys import Recipient
    from torpor.registry import EarlyBlobs, RegistryOptions
    from torpor.signing import SigningKey

# The image path (zstd, chunking, generations, the registry client, encryption) is imported
# where it is taken: a checkpoint into a directory does not pay for it (docs/benchmarks.md).


@dataclass(frozen=True)
class CheckpointTarget:
    """Where the checkpoint goes: a directory, a layout (`oci`), or an image `ref` (pushed)."""

    directory: str | None = None
    oci: bool = False
    ref: str | None = None
    push: bool = False
    registry: RegistryAccess = field(default_factory=RegistryAccess)
    recipients: tuple[Recipient, ...] = ()   # encrypt the image for these (jwe: public keys)
    sign: str | None = None    # with push: sign it with this PEM key (default [image] signing_key)


@dataclass(frozen=True)
class PushSummary:
    reference: str
    uploaded: int
    mounted: int
    existing: int
    bytes_uploaded: int
    signature: str | None = None      # where its signature is (REPO:sha256-<hex>.sig)


@dataclass(frozen=True)
class CheckpointResult:
    container: str
    stopped: bool                     # the container was stopped by the checkpoint
    sizes: Sizes
    timings: dict[str, float]
    directory: str | None = None      # a checkpoint directory
    ref: str | None = None            # an image in the local store
    layout: str | None = None         # where the image's OCI layout is
    digest: str | None = None         # the image index's digest
    raw_bytes: int = 0                # the checkpoint's files, uncompressed
    compressed_bytes: int = 0         # what the image stores (docs/generations.md)
    pushed: PushSummary | None = None
    new_bytes: int = 0                # blobs the previous generation did not have
    previous: str | None = None       # the local image it was built on
    followed_bytes: int = 0           # of CRIU's pages cut and hashed while the dump ran
    early_packed_bytes: int = 0       # of CRIU's pages packed (and sent) while the dump ran

    @property
    def written_bytes(self) -> int:
        """What it wrote on this node: a directory's files; an image's blobs that its previous
        generation did not hold (all of its own for a first one)."""
        return self.sizes.total if self.directory else self.new_bytes

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("sizes", "pushed")}
        out["written_bytes"] = self.written_bytes
        out["sizes"] = self.sizes.__dict__
        out["pushed"] = self.pushed.__dict__ if self.pushed else None
        return out


def checkpoint(client: Client, container_id: str, request: CheckpointRequest,
               target: CheckpointTarget, cfg: Config,
               progress: Progress = SILENT) -> CheckpointResult:
    started = time.monotonic()
    # 1. one at a time; what crashes left; the container; the registry's credentials
    lock = ContainerLock.acquire(cfg.runtime_state_dir, client.address, client.namespace,
                                 container_id, f"by torpor pid {os.getpid()}")
    try:
        with signals_abort():
            result = _checkpoint(client, container_id, request, target, cfg, progress, started)
    finally:
        lock.release()
    tally.add("written", result.written_bytes)
    tally.add("pushed", result.pushed.bytes_uploaded if result.pushed else 0)
    return result


def _checkpoint(client: Client, container_id: str, request: CheckpointRequest,
                target: CheckpointTarget, cfg: Config, progress: Progress,
                started: float) -> CheckpointResult:
    for recovered in recover.recover(cfg):
        progress.step(f"recovered {recovered.describe()}")
    progress.step(f"reading container {container_id}")
    container = _read_container(client, container_id)
    if (target.ref or target.oci) and cfg.image_encrypt_recipients:
        # an image of this node is encrypted as its configuration says, early uploads included
        from torpor.image.encryption_keys import node_recipients

        target = replace(target, recipients=node_recipients(cfg, target.recipients))
    push: RegistryOptions | None = None
    early: EarlyBlobs | None = None
    signing_key: SigningKey | None = None
    if target.push and target.ref:
        from torpor.ops.sources import registry_options
        from torpor.registry import EarlyBlobs

        push = registry_options(cfg, target.ref, target.registry)
        early = EarlyBlobs(target.ref, push, _mount_from(container, target.ref))
        # its session finds the credentials now; the signing key is read now too
        from torpor.signing import load_signing_key

        key_path = target.sign or cfg.image_signing_key
        signing_key = load_signing_key(key_path) if key_path else None
    try:
        if early is not None:   # reachable, credentials accepted: before CRIU touches it
            _check_registry(early, container_id)
        # 2. the journal and the output's place
        checkpoint_id = journals.new_id()
        txn = Transaction.begin(client, cfg, checkpoint_id, container_id,
                                request.criu.leave_running, _plan(cfg, target, checkpoint_id),
                                progress)
        try:
            return _run(txn, container, request, target, cfg, progress, started, early, push,
                        signing_key)
        except BaseException as error:
            raise _failed(txn, container_id, error) from None
        finally:
            txn.close()
    finally:
        if early is not None:  # ends its uploads and its session (again: harmless)
            early.__exit__(None, CheckpointError("closing"), None)


def _run(txn: Transaction, container: CheckpointedContainer, request: CheckpointRequest,
         target: CheckpointTarget, cfg: Config, progress: Progress, started: float,
         early: EarlyBlobs | None, push: RegistryOptions | None,
         signing_key: SigningKey | None = None) -> CheckpointResult:
    plan = txn.record.target
    stopped = not request.criu.leave_running
    if plan.scratch:
        os.makedirs(plan.scratch, mode=0o700)
    if plan.directory:
        os.makedirs(plan.directory, mode=0o700, exist_ok=True)
        os.chmod(plan.directory, 0o700)
    directory = os.path.join(plan.scratch, "checkpoint") if plan.scratch else plan.directory
    assert directory is not None
    os.makedirs(directory, mode=0o700, exist_ok=True)
    # 3.-6. the dump and the checkpoint directory; for an image, its pages cut as CRIU writes
    # them, cut as the generation it builds on was; to a registry, the biggest packed and sent
    follower = packer = basis = None
    # the blobs that go up while the image is built (an encrypted image's: after it)
    ahead = None if target.recipients else early
    if plan.scratch:
        from torpor.image.follow import DumpFollower
        from torpor.image.generations import params_of
        from torpor.ops import generation

        # the generation it builds on: only what that one lacks is written (ops/generation.py)
        basis = generation.basis(txn.client, cfg, Store(cfg.image_store), container.record.id,
                                 container.record.image, target.ref,
                                 Path(plan.scratch) / "held")
        previous = basis.previous
        follower = DumpFollower(os.path.join(directory, names.CRIU_DIR),
                                params_of(previous.chunks if previous else None),
                                cfg.image_zstd_level)
        # (packs are moved into the layout when built: not where -o DIR is on another filesystem)
        if ahead is not None and \
                os.stat(plan.scratch).st_dev == os.stat(plan.directory if target.oci and
                                                        plan.directory else plan.scratch).st_dev:
            from torpor.image.build import early_sender
            from torpor.image.early_packs import EarlyPacker

            pack_dir = os.path.join(plan.scratch, "packs")
            packer = EarlyPacker(follower, pack_dir, previous.known if previous else {},
                                 cfg.image_zstd_level, on_pack=early_sender(
                                     pack_dir, functools.partial(ahead.submit, behind=True)))
    try:
        metadata = checkpoint_into(txn, container, request, directory, progress, started,
                                   kept=plan.scratch is None,
                                   beside_dump=_beside(follower, packer))
        if early is not None:   # the dump is over: what went up below CRIU goes on as the rest
            early.forward()
        if plan.scratch is None:
            synced = _make_durable(txn, progress, directory)
            txn.commit()
            return CheckpointResult(container.record.id, stopped, metadata.sizes,
                                    {**metadata.timings, "sync_s": synced,
                                     "total_s": time.monotonic() - started},
                                    directory=directory)

        # 7. the image, 8. the push or the store
        from torpor.image import build as image_build
        from torpor.ops.sources import tag_of

        followed = follower.followed if follower is not None else None
        packed = packer.packed if packer is not None else None
        assert basis is not None
        t = time.monotonic()
        txn.step("compressing")
        progress.step("compressing layers (zstd, in parallel)" + (
            f" and pushing them to {target.ref}" if ahead is not None else ""))
        # (the uploads waited for: the first that failed raises)
        with ahead if ahead is not None else contextlib.nullcontext():
            built = image_build.build(
                txn.client, directory, _layout_dir(plan, target), ref_name=tag_of(target.ref),
                level=cfg.image_zstd_level,
                on_blob=ahead.submit if ahead is not None else None,
                previous=basis.previous, annotations=basis.annotations, followed=followed,
                packed=packed)
    finally:   # an open pack's file, wherever it stopped (build() took what it could)
        if packer is not None:
            packer.abandon()
    follower = followed = packer = packed = None   # its chunks' digests: ~300 MiB per 100 GiB
    from torpor.image import encrypt_layout, sound_indexes
    from torpor.ops.sources import mount_from
    from torpor.registry import push_layout
    from torpor.registry.layout import Layout

    ref = target.ref
    sound_indexes.record(Path(cfg.image_store), built.chunk_index)  # a basis for the next one
    if target.recipients:
        progress.step(f"encrypting the layers for {len(target.recipients)} recipient(s)")
        built = encrypt_layout.encrypt_built(built, target.recipients, tag_of(ref))
    timings = {**metadata.timings, "dump_s": metadata.timings["checkpoint_s"],
               "checkpoint_s": t - started, "build_s": time.monotonic() - t}
    from torpor.signing import own

    own.record(cfg.image_store, built.index.digest)   # this node's own: restorable here unsigned
    pushed = None
    if push is not None and ref:
        txn.step("pushing")
        progress.step(f"pushing the manifests of {ref}")
        t = time.monotonic()
        result = push_layout(built.layout, ref, options=push,
                             mount_from=mount_from(metadata, ref))
        signature = None
        if signing_key is not None:
            from torpor.signing import sign_image

            progress.step(f"signing {result.digest} with {signing_key.path}")
            signature = sign_image(ref, result.digest, signing_key, push).signature
        timings["push_s"] = time.monotonic() - t
        up, mounted, sent = (ahead.uploaded, ahead.mounted, ahead.bytes_uploaded) if ahead \
            else (0, 0, 0)  # what went up early, while compressing, counts too
        # the manifests' push found those of the image present (packs sent during the dump
        # that the generation did not take are not the image's)
        built_layout = Layout(built.layout)
        ours = sum(1 for digest in ahead.sent if built_layout.has_blob(digest)) if ahead else 0
        pushed = PushSummary(str(result.reference), result.uploaded + up,
                             result.mounted + mounted, result.existing - ours,
                             result.bytes_uploaded + sent, signature)
    layout = str(built.layout)
    if ref and not target.oci:
        txn.step("installing")
        layout = str(Store(cfg.image_store).install(ref, built.layout))
    # 9. on disk, then commit
    timings["sync_s"] = _make_durable(txn, progress, os.path.realpath(layout))
    txn.commit()
    timings["total_s"] = time.monotonic() - started
    return CheckpointResult(container.record.id, stopped, metadata.sizes, timings, ref=ref,
                            layout=layout, digest=built.index.digest,
                            raw_bytes=built.raw_bytes, compressed_bytes=built.compressed_bytes,
                            pushed=pushed, new_bytes=built.new_bytes, previous=built.previous,
                            followed_bytes=built.chunks.followed_bytes if built.chunks else 0,
                            early_packed_bytes=built.chunks.early_bytes if built.chunks else 0)


def _layout_dir(plan: JournalTarget, target: CheckpointTarget) -> str:
    """Where the image's layout is built: the output itself for -o DIR --oci."""
    assert plan.scratch is not None
    return plan.directory if target.oci and plan.directory else \
        os.path.join(plan.scratch, "layout")


@contextlib.contextmanager
def _beside(*parts: AbstractContextManager[object] | None) -> Iterator[None]:
    """The parts entered in order, for as long as the dump runs, and left in reverse."""
    with contextlib.ExitStack() as stack:
        for part in parts:
            if part is not None:
                stack.enter_context(part)
        yield


def _make_durable(txn: Transaction, progress: Progress, output: str) -> float:
    """The checkpoint's files and directories on disk before the commit lets CRIU stop the
    container (a power loss after it must find a checkpoint that restores); the seconds."""
    txn.step("syncing")
    progress.step(f"syncing {output} to disk")
    return durable.sync_tree(output).seconds


def _failed(txn: Transaction, container_id: str, error: BaseException) -> BaseException:
    """Abort the transaction; the error to raise, saying where the container stands."""
    reason = _reason(error)
    try:
        kept = txn.abort(reason)
    except BaseException as e:  # the abort itself failed: say so, the journal still tells
        return CheckpointError(f"checkpoint of {container_id} failed: {reason}; then its "
                               f"clean-up failed too: {_reason(e)}",
                               hint="run `torpor recover` to finish it")
    if not kept:
        where = txn.record.target.scratch or txn.record.target.directory
        return CheckpointError(
            f"checkpoint of {container_id} failed after its dump: {reason}",
            hint=f"the runtime stopped {container_id} at the dump; its CRIU images are kept in "
                 f"{where}")
    state = "was never stopped" if txn.record.leave_running else "runs on, as before"
    if isinstance(error, TorporError):  # its own words, and where the container stands
        error.hint = (f"{error.hint}; " if error.hint else "") + \
            f"{container_id} {state}; nothing was kept"
        return error
    return CheckpointError(f"checkpoint of {container_id} failed: {reason}",
                           hint=f"{container_id} {state}; nothing was kept")


def _check_registry(early: EarlyBlobs, container_id: str) -> None:
    try:
        early.check_access()
    except TorporError as error:
        error.hint = (f"{error.hint}; " if error.hint else "") + \
            f"checked before checkpointing: {container_id} was not touched"
        raise


def _reason(error: BaseException) -> str:
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, OSError) and error.strerror:
        where = error.filename2 or error.filename  # a copy's destination is what filled up
        return f"{error.strerror}" + (f": {where}" if where else "")
    return " ".join(str(error).split()) or type(error).__name__


def _read_container(client: Client, container_id: str) -> CheckpointedContainer:
    record = client.get_container(container_id)
    runtime = runc_runtime.require_torpor(record)
    try:
        task = client.get_task(container_id).process
    except NotFound:
        raise CheckpointError(f"container {container_id} has no running task to checkpoint") \
            from None
    if task.status not in (RUNNING, PAUSED):
        raise CheckpointError(f"the task of {container_id} is not running")
    image_name = record.image or _cri_image_name(record)
    image = containerd_image.image_chain(client, image_name) if image_name else None
    return CheckpointedContainer(record, runtime, image, task.pid)


def _mount_from(container: CheckpointedContainer, ref: str) -> list[str]:
    """The base image's repository, when it lives in the target's registry."""
    from torpor.registry import parse_reference

    if container.image is None:
        return []
    try:
        base, target = parse_reference(container.image.name), parse_reference(ref)
    except TorporError:
        return []
    return [base.repository] if base.registry == target.registry else []


def _plan(cfg: Config, target: CheckpointTarget, checkpoint_id: str) -> JournalTarget:
    """Where each part goes, recorded in the journal before anything is written."""
    store = Store(cfg.image_store)
    directory = os.path.abspath(target.directory) if target.directory else None
    created = False
    if directory is not None:  # new or empty, and only root and the user can reach it
        created = not output_path.check_dir(directory, "the checkpoint", CheckpointError)
    scratch = None
    if target.ref is not None or target.oci:
        scratch = str(store.root / "scratch" / f"ck-{checkpoint_id}")
    return JournalTarget(directory=directory, created_directory=created, oci=target.oci,
                         ref=target.ref, push=target.push, store=str(store.root),
                         scratch=scratch)


def _cri_image_name(container: containers_pb2.Container) -> str:
    """A Kubernetes pod's container names no image in containerd; its spec does."""
    import json

    spec = json.loads(container.spec.value) if container.spec.value else {}
    annotations = spec.get("annotations") or {}
    return str(annotations.get(ann.CRI_IMAGE_NAME) or "")
