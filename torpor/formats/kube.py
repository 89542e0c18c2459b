"""kubelet's checkpoint archive: the engine's records in it (names.KUBE_*), as containerd 2.x
writes and reads them. checkpointctl reads the same files (its lib/metadata.go).

- config.dump: the container's id and name, its base image (tag and NAME@DIGEST: containerd
  2.1.x pulls that digest again on restore), the runtime's name, when it was made and taken;
- status.dump: the CRI ContainerStatus as Go's encoding/json writes it (snake_case keys); a
  containerd 2.1+ restore refuses an archive without it and takes the container's CRI name,
  labels, annotations and image from it. torpor keeps the fields below and writes the same.

The archive does not say which runtime class made it: `runtime` is the shim's name
(io.containerd.runc.v2 for runc and torpor alike).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from torpor.errors import FormatError
from torpor.formats.fields import Fields

GO_ZERO_TIME = "0001-01-01T00:00:00Z"
CONTAINER_RUNNING = 1     # runtime.v1.ContainerState_CONTAINER_RUNNING


@dataclass(frozen=True)
class KubeContainerConfig:
    """config.dump."""

    id: str
    name: str
    rootfs_image: str                  # the image as the pod named it
    rootfs_image_ref: str              # NAME@DIGEST
    rootfs_image_name: str
    runtime: str                       # the shim's runtime name
    created: str = GO_ZERO_TIME
    checkpointed: str = GO_ZERO_TIME

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "rootfsImage": self.rootfs_image,
                "rootfsImageRef": self.rootfs_image_ref,
                "rootfsImageName": self.rootfs_image_name, "runtime": self.runtime,
                "createdTime": self.created, "checkpointedTime": self.checkpointed,
                "restoredTime": GO_ZERO_TIME, "restored": False}

    @classmethod
    def from_json(cls, f: Fields) -> KubeContainerConfig:
        return cls(id=f.string("id"), name=f.string("name", ""),
                   rootfs_image=f.string("rootfsImage", ""),
                   rootfs_image_ref=f.string("rootfsImageRef", ""),
                   rootfs_image_name=f.string("rootfsImageName", ""),
                   runtime=f.string("runtime", ""),
                   created=f.string("createdTime", GO_ZERO_TIME),
                   checkpointed=f.string("checkpointedTime", GO_ZERO_TIME))


@dataclass(frozen=True)
class KubeContainerStatus:
    """status.dump: the parts of CRI's ContainerStatus a restore reads."""

    id: str
    name: str                          # the container's name in its pod (CRI metadata.name)
    image: str
    image_ref: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    log_path: str = ""
    attempt: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "metadata": {"name": self.name, "attempt": self.attempt},
                "state": CONTAINER_RUNNING, "image": {"image": self.image},
                "image_ref": self.image_ref, "labels": self.labels,
                "annotations": self.annotations, "log_path": self.log_path}

    @classmethod
    def from_json(cls, f: Fields) -> KubeContainerStatus:
        metadata = f.optional_child("metadata")
        image = f.optional_child("image")
        return cls(id=f.string("id", ""), name=metadata.string("name", "") if metadata else "",
                   image=image.string("image", "") if image else "",
                   image_ref=f.string("image_ref", ""),
                   labels=f.labels("labels"), annotations=f.labels("annotations"),
                   log_path=f.string("log_path", ""),
                   attempt=metadata.integer("attempt", 0) if metadata else 0)


def loads(data: bytes, what: str) -> Fields:
    """A JSON object from one of the archive's files, for the from_json above."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise FormatError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(document, dict):
        raise FormatError(f"{what} is not a JSON object")
    return Fields(document, what)


def dumps(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()
