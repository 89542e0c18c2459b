"""A checkpoint's metadata: `checkpoint.json` in a checkpoint directory, and the config blob of
a checkpoint image's state manifest. Everything a restore checks before it downloads or touches
anything: the container and its spec, its base image, the request, the node it was taken on,
torpor-runc's state, the files with their sizes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from torpor.errors import FormatError
from torpor.formats import names
from torpor.formats.fields import Fields, check_format
from torpor.formats.files import FileEntry, Sizes, file_entries
from torpor.formats.flat import from_flat, to_flat
from torpor.formats.node import NodeFacts
from torpor.formats.oci import Descriptor, OciSpec
from torpor.formats.request import CheckpointRequest
from torpor.formats.state import ContainerState


@dataclass(frozen=True)
class RuntimeInfo:
    """How containerd ran the container: the shim's name and runc's options."""

    name: str
    binary_name: str = ""
    root: str = ""
    systemd_cgroup: bool = False


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    image: str
    runtime: RuntimeInfo
    spec: OciSpec                           # the OCI runtime spec, kept whole
    labels: dict[str, str] = field(default_factory=dict)
    snapshotter: str = ""
    snapshot_key: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "image": self.image, "runtime": to_flat(self.runtime),
                "spec": self.spec, "labels": self.labels, "snapshotter": self.snapshotter,
                "snapshot_key": self.snapshot_key}

    @classmethod
    def from_json(cls, f: Fields) -> ContainerInfo:
        return cls(id=names.check_identifier(f.string("id"), f"{f.what}: the container id"),
                   image=f.string("image", ""),
                   runtime=from_flat(RuntimeInfo, f.child("runtime")), spec=f.document("spec"),
                   labels=f.labels("labels"), snapshotter=f.string("snapshotter", ""),
                   snapshot_key=f.string("snapshot_key", ""))


@dataclass(frozen=True)
class BaseImage:
    """The container's image as containerd holds it: its manifest for this platform, config and
    layers, and the chain ID of its unpacked snapshot."""

    name: str
    target: Descriptor
    manifest: Descriptor
    config_digest: str
    layers: tuple[Descriptor, ...]
    diff_ids: tuple[str, ...]
    chain_id: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "target": self.target.to_json(),
                "manifest": self.manifest.to_json(), "config_digest": self.config_digest,
                "layers": [layer.to_json() for layer in self.layers],
                "diff_ids": list(self.diff_ids), "chain_id": self.chain_id}

    @classmethod
    def from_json(cls, f: Fields) -> BaseImage:
        return cls(name=f.string("name"),
                   target=Descriptor.from_json(f.data.get("target"), f"{f.what}: target"),
                   manifest=Descriptor.from_json(f.data.get("manifest"), f"{f.what}: manifest"),
                   config_digest=f.string("config_digest"),
                   layers=tuple(Descriptor.from_json(x.data, x.what)
                                for x in f.children("layers")),
                   diff_ids=tuple(f.strings("diff_ids")), chain_id=f.string("chain_id", ""))


@dataclass(frozen=True)
class CheckpointMetadata:
    torpor_version: str
    created: str
    container: ContainerInfo
    image: BaseImage | None
    request: CheckpointRequest
    node: NodeFacts
    state: ContainerState
    sizes: Sizes = field(default_factory=Sizes)
    timings: dict[str, float] = field(default_factory=dict)
    files: tuple[FileEntry, ...] = ()
    rootfs_in_image: bool = False           # the read-write layer is in the runnable image

    def to_json(self) -> dict[str, Any]:
        return {"format": names.CHECKPOINT_FORMAT, "torpor_version": self.torpor_version,
                "created": self.created, "container": self.container.to_json(),
                "image": self.image.to_json() if self.image else None,
                "request": self.request.to_json(), "node": self.node.to_json(),
                "state": self.state.to_json(), "sizes": to_flat(self.sizes),
                "timings": self.timings, "files": [to_flat(x) for x in self.files],
                "rootfs_in_image": self.rootfs_in_image}

    @classmethod
    def from_json(cls, f: Fields) -> CheckpointMetadata:
        check_format(f, names.CHECKPOINT_FORMAT)
        image = f.optional_child("image")
        sizes = f.optional_child("sizes")
        return cls(torpor_version=f.string("torpor_version", ""), created=f.string("created", ""),
                   container=ContainerInfo.from_json(f.child("container")),
                   image=BaseImage.from_json(image) if image else None,
                   request=CheckpointRequest.from_json(f.child("request")),
                   node=NodeFacts.from_json(f.child("node")),
                   state=ContainerState.from_json(f.child("state")),
                   sizes=from_flat(Sizes, sizes) if sizes else Sizes(),
                   timings=f.numbers("timings"), files=file_entries(f, "files"),
                   rootfs_in_image=f.boolean("rootfs_in_image", False))

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode()

    @classmethod
    def loads(cls, data: bytes, what: str) -> CheckpointMetadata:
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise FormatError(f"{what} is not valid JSON: {e}") from None
        return cls.from_json(Fields(document, what))
