"""`torpor inspect SOURCE`: what a checkpoint holds, from its metadata alone (a registry image is
inspected without downloading a layer): the container, its processes and memory, network,
mounts, GPUs, the node it was taken on, its layers and timings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torpor.config import Config
from torpor.formats import annotations as ann
from torpor.formats.metadata import CheckpointMetadata
from torpor.formats.oci import Descriptor
from torpor.image import directory as checkpoint_dir
from torpor.image import unpack
from torpor.image.store import Store
from torpor.ops.access import NO_CREDENTIALS, RegistryAccess
from torpor.ops.sources import SourceKind, image_of_plan, kind_of, registry_options
from torpor.registry import fetch_metadata


@dataclass(frozen=True)
class InspectReport:
    source: str
    kind: SourceKind
    digest: str | None              # the image index's digest (None for a directory)
    metadata: CheckpointMetadata
    layers: tuple[Descriptor, ...]  # state layers, then the read-write layer

    def to_json(self) -> dict[str, Any]:
        m = self.metadata
        network = m.state.network
        return {
            "source": self.source, "kind": self.kind.value, "digest": self.digest,
            "container": m.container.id, "image": m.image.name if m.image else None,
            "created": m.created, "torpor_version": m.torpor_version,
            "request": m.request.to_json(), "sizes": m.sizes.__dict__, "timings": m.timings,
            "node": m.node.to_json(), "criu": m.state.criu.to_json(),
            "network": {
                "links": [{"ifname": link.ifname, "kind": link.kind, "address": link.address,
                           "mtu": link.mtu, "state": link.state} for link in network.config.links],
                "addresses": [f"{a.address}/{a.prefixlen} ({a.ifname})"
                              for a in network.config.addresses],
                "sockets": [s.__dict__ for s in network.sockets],
                "netns_path": network.netns_path},
            "mounts": [{k: mount.get(k) for k in ("destination", "type", "source")}
                       for mount in m.container.spec.get("mounts") or []],
            "files": m.state.files.to_json(),
            "processes": [p.to_json() for p in m.state.processes],
            "gpus": m.state.gpu.to_json() if m.state.gpu else {},
            "layers": [{"mediaType": d.media_type, "digest": d.digest, "size": d.size,
                        **({"part": d.annotations[ann.PART]} if ann.PART in d.annotations
                           else {})} for d in self.layers],
        }


def inspect(source: str, cfg: Config, access: RegistryAccess = NO_CREDENTIALS) -> InspectReport:
    store = Store(cfg.image_store)
    kind = kind_of(source, store)
    if kind is SourceKind.DIRECTORY:
        return InspectReport(source, kind, None, checkpoint_dir.load(source), ())
    if kind is SourceKind.REGISTRY:
        with fetch_metadata(source, registry_options(cfg, source, access)) as plan:
            image = image_of_plan(plan)
    else:
        image = unpack.open_layout(source if kind is SourceKind.LAYOUT
                                   else str(store.layout(source)))
    layers = (*image.state_layers, *image.runnable_blobs[1:])
    return InspectReport(source, kind, image.index.digest, image.metadata, tuple(layers))
