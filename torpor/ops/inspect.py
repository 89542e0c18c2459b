"""`torpor inspect SOURCE`: what a checkpoint holds, from its metadata alone (a registry image is
inspected without downloading a layer): the container, its processes and memory, network,
mounts, GPUs, the node it was taken on, its layers and timings; and what a restore on this node
would grant its spec (hooks, host mounts, devices, capabilities, namespaces), with what allows
each request under this node's policy, or what would; for a checkpoint directory, what its CRIU
images would restore beyond its spec (torpor.criu_images), as a restore here would refuse it.

An encrypted checkpoint shows its clear metadata only, unless a decryption key opens its
metadata layer (from a registry, that one small layer is downloaded into scratch space).

A kubelet checkpoint archive is read without extracting it, and its report adds its pod and who
can restore it.

A registry image's report lists its signatures (cosign's `.sig` tag) and whether each verifies
with a key of `[restore] trusted_keys`; nothing is refused here.

An image's report says too what it added to the generation it was built on, beside the estimate
`torpor estimate` made before it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from torpor import criu_images, signing
from torpor.capture.restore_policy import RestorePolicy, Verdict, verdicts
from torpor.config import Config
from torpor.criu_images import Finding
from torpor.errors import TorporError
from torpor.formats import annotations as ann
from torpor.formats import names
from torpor.formats.metadata import CheckpointMetadata
from torpor.formats.oci import Descriptor
from torpor.formats.spec_requests import SpecRequests
from torpor.image import directory as checkpoint_dir
from torpor.image import kube_archive, ocicrypt, unpack
from torpor.image.encryption_annotations import layer_recipients
from torpor.image.encryption_keys import DecryptionKey
from torpor.image.store import Store
from torpor.lazy import progress as lazy_progress
from torpor.lazy.progress import LazyProgress
from torpor.ops import kube
from torpor.ops.access import NO_CREDENTIALS, RegistryAccess
from torpor.ops.sources import SourceKind, image_of_plan, kind_of, registry_options
from torpor.registry import fetch_metadata
from torpor.registry.client import RepositoryClient
from torpor.signing import SignatureCheck


@dataclass(frozen=True)
class KubeSummary:
    """A kubelet archive's own records."""

    container: str                  # the container's name in its pod
    pod: str
    namespace: str
    runtime: str                    # the shim's name; the runtime class is not recorded
    base_image_ref: str             # NAME@DIGEST, pulled again by a pod's restore
    torpor_state: bool              # a torpor pod took it: restore it in one
    checkpoint_bytes: int           # checkpoint/ (CRIU's images and torpor's files)
    rootfs_diff_bytes: int          # rootfs-diff.tar, compressed

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class InspectReport:
    source: str
    kind: SourceKind
    digest: str | None              # the image index's digest (None for a directory)
    metadata: CheckpointMetadata
    layers: tuple[Descriptor, ...]  # state layers, then the read-write layer
    encrypted: bool = False
    recipients: tuple[str, ...] = ()          # the encrypted layers' key algorithms
    sealed: bool = False            # encrypted, and its metadata layer not opened: no spec
    grants: tuple[Verdict, ...] = ()          # what a restore here would grant (not if sealed)
    kube: KubeSummary | None = None
    generation: Generation | None = None
    signatures: SignatureCheck | None = None   # a registry image's, against the trusted keys
    criu_findings: tuple[Finding, ...] | None = None   # None: the CRIU images were not read
    criu_error: str = ""            # why they could not be checked
    restoring: tuple[LazyProgress, ...] = ()   # lazy restores of it under way on this node

    def to_json(self) -> dict[str, Any]:
        m = self.metadata
        network = m.state.network
        return {
            "source": self.source, "kind": self.kind.value, "digest": self.digest,
            "encrypted": self.encrypted, "recipients": list(self.recipients),
            "sealed": self.sealed,
            "grants": None if self.sealed else [
                {"what": v.what, "allowed_by": v.allowed_by or None,
                 "remedy": None if v.allowed_by else v.remedy} for v in self.grants],
            "container": m.container.id,
            "image": m.image.name if m.image else (m.container.image or None),
            "kubernetes": self.kube.to_json() if self.kube else None,
            "created": m.created, "torpor_version": m.torpor_version,
            "request": m.request.to_json(), "sizes": m.sizes.__dict__, "timings": m.timings,
            "node": m.node.to_json(), "criu": m.state.criu.to_json(),
            "network": {
                "links": [{"ifname": link.ifname, "kind": link.kind, "address": link.address,
                           "mtu": link.mtu, "state": link.state} for link in network.config.links],
                "addresses": [f"{a.address}/{a.prefixlen} ({a.ifname})"
                              for a in network.config.addresses],
                "sockets": [s.__dict__ for s in network.sockets],
                # a namespace runc made lived and ended with the container (its path was its
                # init's /proc/PID/ns/net): only a joined one is still a place
                "netns_path": "" if network.created_by_runtime else network.netns_path,
                "own_namespace": network.created_by_runtime},
            "mounts": [{k: mount.get(k) for k in ("destination", "type", "source")}
                       for mount in m.container.spec.get("mounts") or []],
            "files": m.state.files.to_json(),
            "processes": [p.to_json() for p in m.state.processes],
            "gpus": m.state.gpu.to_json() if m.state.gpu else {},
            "layers": [{"mediaType": d.media_type, "digest": d.digest, "size": d.size,
                        **({"part": d.annotations[ann.PART]} if ann.PART in d.annotations
                           else {})} for d in self.layers],
            "generation": self.generation.__dict__ if self.generation else None,
            "signatures": self.signatures.to_json() if self.signatures else None,
            "criu_images": None if self.criu_findings is None and not self.criu_error else {
                "error": self.criu_error or None,
                "findings": [{"what": f.what, "remedy": f.remedy}
                             for f in self.criu_findings or ()]},
            "restoring": [dict(asdict(p), fraction=p.fraction) for p in self.restoring],
        }


@dataclass(frozen=True)
class Generation:
    """An image as one generation of a chain: what it stores, what it added to the generation
    it was built on, and the estimate `torpor estimate` made before it (docs/format.md)."""

    stored_bytes: int                 # its own blobs (configs, state layers, read-write layer)
    new_bytes: int | None             # of those, the ones its previous generation did not have
    memory_new_bytes: int | None      # of which new packs
    previous: str | None              # the previous generation's image index digest
    estimate_full_bytes: int | None
    estimate_new_bytes: int | None
    estimate_created: str | None


def _number(annotations: dict[str, str], key: str) -> int | None:
    try:
        return int(annotations[key])
    except (KeyError, ValueError):
        return None


def generation_of(image: unpack.CheckpointImage) -> Generation:
    notes = image.state_manifest.get("annotations") or {}
    stored = sum(d.size for d in image.own_blobs)
    return Generation(stored, _number(notes, ann.NEW_BYTES), _number(notes, ann.CHUNKS_NEW_BYTES),
                      notes.get(ann.PREVIOUS), _number(notes, ann.ESTIMATE_FULL),
                      _number(notes, ann.ESTIMATE_NEW), notes.get(ann.ESTIMATE_AT))


def inspect(source: str, cfg: Config, access: RegistryAccess = NO_CREDENTIALS,
            keys: Sequence[DecryptionKey] = ()) -> InspectReport:
    store = Store(cfg.image_store)
    kind = kind_of(source, store)
    limits = unpack.ImageLimits.of(cfg)
    if kind is SourceKind.DIRECTORY:
        metadata = checkpoint_dir.load(source, max_files=limits.max_files)
        findings, error = _criu_findings(source, metadata, cfg)
        return InspectReport(source, kind, None, metadata, (), grants=_grants(metadata, cfg),
                             criu_findings=findings, criu_error=error)
    if kind is SourceKind.KUBE_ARCHIVE:
        return _kube_report(source)
    with store.scratch() as scratch:
        if kind is SourceKind.REGISTRY:
            def look(repo: RepositoryClient, top: Descriptor) -> None:
                found.append(signing.examine(repo, top.digest, cfg))

            found: list[SignatureCheck] = []   # what a restore's check would see, unrefused
            with fetch_metadata(source, registry_options(cfg, source, access), look) as plan:
                image = image_of_plan(plan, limits)
                layout = str(scratch / "layout")
                wanted = [layer for layer in plan.layers
                          if layer.descriptor == image.metadata_layer]
                if keys and wanted:
                    plan.download(layout, wanted)
        else:
            layout = source if kind is SourceKind.LAYOUT else str(store.layout(source))
            image = unpack.open_layout(layout, limits=limits)
        sealed = image.metadata_layer is not None and ocicrypt.is_encrypted(
            image.metadata_layer.media_type) and not keys
        metadata = image.metadata if sealed else unpack.full_metadata(
            image, layout, keys, str(scratch), limits)
    encrypted = [d for d in (*image.state_layers, *image.own_layers)
                 if ocicrypt.is_encrypted(d.media_type)]
    recipients = tuple(sorted({r for d in encrypted for r in layer_recipients(d.annotations)}))
    layers = (*image.state_layers, *image.runnable_blobs[1:])
    return InspectReport(source, kind, image.index.digest, metadata, tuple(layers),
                         bool(encrypted), recipients, sealed,
                         () if sealed else _grants(metadata, cfg),
                         generation=generation_of(image),
                         signatures=found[0] if kind is SourceKind.REGISTRY else None,
                         restoring=tuple(lazy_progress.of_image(
                             cfg.runtime_state_dir, source, image.index.digest)))


def _grants(metadata: CheckpointMetadata, cfg: Config) -> tuple[Verdict, ...]:
    """What a restore under the same name, with no options, would be granted or refused."""
    requests = SpecRequests.of(metadata.container.spec)
    return tuple(verdicts(requests, RestorePolicy.of(cfg)))


def _criu_findings(directory: str, metadata: CheckpointMetadata,
                   cfg: Config) -> tuple[tuple[Finding, ...] | None, str]:
    """What the directory's CRIU images would restore beyond its spec, or why that is unknown."""
    try:
        return tuple(criu_images.findings(os.path.join(directory, names.CRIU_DIR),
                                          metadata.container.spec, cfg)), ""
    except TorporError as e:   # the definitions missing (RestoreError), a malformed image
        return None, str(e)


def _kube_report(source: str) -> InspectReport:
    found = kube_archive.read(source)
    annotations = found.spec.get("annotations") or {}
    summary = KubeSummary(
        container=found.container_name, pod=str(annotations.get(ann.CRI_SANDBOX_NAME) or ""),
        namespace=str(annotations.get(ann.CRI_SANDBOX_NAMESPACE) or ""),
        runtime=found.config.runtime, base_image_ref=found.config.rootfs_image_ref,
        torpor_state=found.state is not None, checkpoint_bytes=found.checkpoint_bytes,
        rootfs_diff_bytes=found.rootfs_diff_bytes)
    metadata = kube.metadata_of(found, None, found.entries)
    return InspectReport(source, SourceKind.KUBE_ARCHIVE, None, metadata, (), kube=summary)
