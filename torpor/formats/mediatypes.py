"""Media types, artifact type and annotation keys of torpor's checkpoint images (docs/format.md)."""

from __future__ import annotations

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
OCI_LAYER_TYPES = (
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar.zstd",
)

ARTIFACT_TYPE = "application/vnd.torpor.checkpoint.v1"
CHECKPOINT_CONFIG = "application/vnd.torpor.checkpoint.config.v1+json"
CRIU_LAYER = "application/vnd.torpor.checkpoint.criu.v1.tar+zstd"
VOLUMES_LAYER = "application/vnd.torpor.checkpoint.volumes.v1.tar+zstd"
STATE_LAYER = "application/vnd.torpor.checkpoint.state.v1.tar+zstd"
STATE_LAYER_TYPES = (CRIU_LAYER, VOLUMES_LAYER, STATE_LAYER)

ROLE = "io.torpor.checkpoint.role"            # "runnable" or "state", on index entries
CONTAINER = "io.torpor.checkpoint.container"  # the checkpointed container's id
FORMAT = "io.torpor.checkpoint.format"        # torpor.checkpoint.v1
PART = "io.torpor.checkpoint.part"            # "i/n" on CRIU image parts
CREATED = "org.opencontainers.image.created"
REF_NAME = "org.opencontainers.image.ref.name"
BASE_NAME = "org.opencontainers.image.base.name"
BASE_DIGEST = "org.opencontainers.image.base.digest"
TITLE = "org.opencontainers.image.title"
RANGE_PAX = "TORPOR.range"                    # "<offset> <total size>" on pieces of big files
