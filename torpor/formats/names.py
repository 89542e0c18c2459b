"""Every file and directory name torpor writes, and the format identifier of each versioned
file, defined once. Stdlib only: torpor-runc and torpor-hook import it."""

from __future__ import annotations

# The checkpoint directory (`torpor checkpoint -o DIR`, docs/checkpoint.md)
CHECKPOINT_FORMAT = "torpor.checkpoint.v1"       # checkpoint.json's "format"
CHECKPOINT_METADATA = "checkpoint.json"
CRIU_DIR = "criu"                                # CRIU's images, as runc left them
ROOTFS_DIFF = "rootfs-diff.tar"                  # the read-write layer (OCI layer, whiteouts)
CRIU_DUMP_LOG = "criu-dump.log"

# What torpor-runc keeps in a checkpoint's image directory, beside CRIU's own files: flat files
# named torpor-*, never a folder. containerd's CRI (kubelet's checkpoints) copies that directory
# into the archive's checkpoint/ entry by entry, flat: a subdirectory breaks the checkpoint and a
# symlink arrives as an empty file.
STATE_PREFIX = "torpor-"                         # every name below starts with it
CONTAINER_STATE_FORMAT = "torpor.container-state.v1"
CONTAINER_STATE = "torpor-state.json"            # written last: its presence means complete
IMAGE_DIR_ROOTFS_DIFF = "torpor-rootfs-diff.tar" # the read-write layer, until laid out
VOLUME_ARCHIVE_PREFIX = "torpor-volume-"         # <image-path>/torpor-volume-<n>.tar
DEV_SHM_ARCHIVE = "torpor-devshm.tar"


def volume_archive(index: int) -> str:
    return f"{VOLUME_ARCHIVE_PREFIX}{index}.tar"

# Per-container records under [runtime] state_dir (default /run/torpor)
RECORDS_DIR = "containers"                       # <state_dir>/containers/<namespace>/<id>/
CHECKPOINT_REQUEST_FORMAT = "torpor.checkpoint-request.v1"
CHECKPOINT_REQUEST = "checkpoint-request.json"   # `torpor checkpoint`'s options for torpor-runc
RESTORE_PLAN = "restore-net.json"                # torpor-runc restore's network plan for the hook

# OCI image layouts
OCI_LAYOUT_FILE = "oci-layout"
OCI_INDEX_FILE = "index.json"
OCI_BLOBS_DIR = "blobs"
