"""Annotation keys and labels torpor reads or writes, defined once (docs/format.md lists them).

Keys on checkpoint images (index, manifests, layers), keys users put on containers to steer
checkpoints made by ctr or nerdctl, and labels torpor puts on containerd objects. Stdlib only.
"""

from __future__ import annotations

# On checkpoint images
ROLE = "io.torpor.checkpoint.role"            # "runnable" or "state", on index entries
CONTAINER = "io.torpor.checkpoint.container"  # the checkpointed container's id
FORMAT = "io.torpor.checkpoint.format"        # names.CHECKPOINT_FORMAT
PART = "io.torpor.checkpoint.part"            # "i/n" on CRIU image parts
ROLE_RUNNABLE, ROLE_STATE = "runnable", "state"
# on the state manifest: this generation against the one it was built on (docs/format.md)
PREVIOUS = "io.torpor.checkpoint.previous"    # the previous generation's image index digest
NEW_BYTES = "io.torpor.checkpoint.new-bytes"  # bytes of blobs the previous one did not have
CHUNKS_NEW_BYTES = "io.torpor.checkpoint.memory.new-bytes"  # of which new packs
ESTIMATE_FULL = "io.torpor.checkpoint.estimate.full-bytes"  # `torpor estimate` beforehand
ESTIMATE_NEW = "io.torpor.checkpoint.estimate.new-bytes"
ESTIMATE_AT = "io.torpor.checkpoint.estimate.created"

# OCI's own (image-spec annotations.md)
CREATED = "org.opencontainers.image.created"
REF_NAME = "org.opencontainers.image.ref.name"
BASE_NAME = "org.opencontainers.image.base.name"
BASE_DIGEST = "org.opencontainers.image.base.digest"
TITLE = "org.opencontainers.image.title"

# A PAX header (not an annotation) on tar entries that hold a byte range of a bigger file
RANGE_PAX = "TORPOR.range"                    # "<offset> <total size>"

# On containers: what a checkpoint started by ctr or nerdctl cannot ask for on its command line
CHECKPOINT_VOLUMES = "io.torpor.checkpoint.volumes"            # "all", "none" or "/a,/b"
CHECKPOINT_TCP_ESTABLISHED = "io.torpor.checkpoint.tcp-established"  # "true"
CHECKPOINT_FILE_LOCKS = "io.torpor.checkpoint.file-locks"            # "true"
RESTORE_ADD_ADDRESSES = "io.torpor.restore.add-addresses"            # "true"
# a container created from a checkpoint image starts cold where the node restores on create
RESTORE_COLD_START = "io.torpor.restore.cold-start"                  # "true"

# Kubernetes: what containerd's CRI plugin writes into a pod container's spec, and the
# annotation that makes an OCI image a checkpoint to restore (checkpointctl's lib/annotations.go)
CRI_CONTAINER_TYPE = "io.kubernetes.cri.container-type"       # "container" or "sandbox"
CRI_CONTAINER_NAME = "io.kubernetes.cri.container-name"
CRI_SANDBOX_NAME = "io.kubernetes.cri.sandbox-name"
CRI_SANDBOX_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
CRI_SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
CRI_IMAGE_NAME = "io.kubernetes.cri.image-name"
CHECKPOINT_IMAGE_CONTAINER = "org.criu.checkpoint.container.name"
CHECKPOINT_IMAGE_ENGINE = "org.criu.checkpoint.engine.name"
CHECKPOINT_IMAGE_ROOTFS = "org.criu.checkpoint.rootfsImageName"
CHECKPOINT_IMAGE_POD = "org.criu.checkpoint.pod.name"
CHECKPOINT_IMAGE_NAMESPACE = "org.criu.checkpoint.pod.namespace"
CHECKPOINT_IMAGE_RUNTIME = "org.criu.checkpoint.runtime.name"
# runc passes this file to CRIU as its configuration (instead of /etc/criu/runc.conf)
CRIU_CONFIG = "org.criu.config"

# Labels torpor puts on containerd objects
RESTORED_FROM = "io.torpor.restored-from"     # container: the checkpoint it came from
IMAGE_CHECKPOINT = "io.torpor.checkpoint"     # image: the checkpoint index digest it came from
