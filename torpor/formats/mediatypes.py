"""Media types torpor writes or must tell apart, defined once (docs/format.md). Every other type
is an opaque blob, copied as it is. Stdlib only."""

from __future__ import annotations

# OCI image-spec
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
OCI_LAYOUT_VERSION = '{"imageLayoutVersion":"1.0.0"}'

# Docker's schema 2, which registries and containerd still serve
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_LAYER_ZSTD = "application/vnd.docker.image.rootfs.diff.tar.zstd"

INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
IMAGE_MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
MANIFEST_TYPES = INDEX_TYPES | IMAGE_MANIFEST_TYPES
OCI_LAYER_TYPES = (OCI_LAYER_TAR, OCI_LAYER_GZIP, OCI_LAYER_ZSTD, DOCKER_LAYER_GZIP,
                   DOCKER_LAYER_ZSTD)

# The Accept header of every manifest GET: distribution returns 404 for an OCI manifest unless
# the OCI types are listed (notes/formats.md §3.2).
MANIFEST_ACCEPT = ", ".join([OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST])

# torpor's checkpoint images
ARTIFACT_TYPE = "application/vnd.torpor.checkpoint.v1"
CHECKPOINT_CONFIG = "application/vnd.torpor.checkpoint.config.v1+json"
CRIU_LAYER = "application/vnd.torpor.checkpoint.criu.v1.tar+zstd"
VOLUMES_LAYER = "application/vnd.torpor.checkpoint.volumes.v1.tar+zstd"
STATE_LAYER = "application/vnd.torpor.checkpoint.state.v1.tar+zstd"
METADATA_LAYER = "application/vnd.torpor.checkpoint.metadata.v1+json"  # encrypted images only
# CRIU's images as content-defined chunks (formats/chunk_index.py, docs/format.md)
CHUNK_INDEX = "application/vnd.torpor.checkpoint.chunk-index.v1+json"
CHUNK_INDEX_ZSTD = CHUNK_INDEX + "+zstd"         # the same JSON, one zstd frame: what torpor writes
PACK = "application/vnd.torpor.checkpoint.pack.v1"
PACK_INDEX = "application/vnd.torpor.checkpoint.pack-index.v1+json"  # inside each pack
STATE_LAYER_TYPES = (CRIU_LAYER, VOLUMES_LAYER, STATE_LAYER, CHUNK_INDEX, CHUNK_INDEX_ZSTD, PACK)
# ocicrypt's encrypted layers: the plain type + this suffix (torpor.image.ocicrypt)
ENCRYPTED_SUFFIX = "+encrypted"
