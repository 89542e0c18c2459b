"""Every file and directory name torpor writes, and the format identifier of each versioned
file, defined once. Stdlib only: torpor-runc and torpor-hook import it."""

from __future__ import annotations

# containerd's identifiers (pkg/identifiers): container IDs, namespaces, snapshot keys' owners.
# Every name torpor takes from a checkpoint or a user and makes part of a host path (records,
# sandbox files, work directories, logs) is one of these, checked here and nowhere else.
IDENTIFIER_MAX = 76
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_SEPARATORS = frozenset("._-")


def is_identifier(value: str) -> bool:
    """Letters and digits, with single `.`, `_` or `-` between them (containerd's rule)."""
    if not value or len(value) > IDENTIFIER_MAX or value[0] not in _ALNUM \
            or value[-1] not in _ALNUM:
        return False
    previous = ""
    for c in value:
        if c in _SEPARATORS:
            if previous in _SEPARATORS:
                return False
        elif c not in _ALNUM:
            return False
        previous = c
    return True


def check_identifier(value: str, what: str) -> str:
    """`value` if it is a containerd identifier; else FormatError naming `what`: never a
    path, `..` or `/`."""
    from torpor.errors import FormatError

    if not is_identifier(value):
        raise FormatError(f"{what} {value[:100]!r} is not a valid name: letters, digits and "
                          f"'.', '_', '-' between them, at most {IDENTIFIER_MAX} characters")
    return value

# The checkpoint directory (`torpor checkpoint -o DIR`, docs/checkpoint.md)
CHECKPOINT_FORMAT = "torpor.checkpoint.v1"       # checkpoint.json's "format"
CHECKPOINT_METADATA = "checkpoint.json"
CRIU_DIR = "criu"                                # CRIU's images, as runc left them
ROOTFS_DIFF = "rootfs-diff.tar"                  # the read-write layer (OCI layer, whiteouts)
CRIU_DUMP_LOG = "criu-dump.log"
# The mark of a checkpoint's runnable image: this variable in its config's Env, which every engine
# copies into the container's spec (docs/format.md); torpor-runc create looks for it
CHECKPOINT_ENV = "TORPOR_CHECKPOINT"
# runc's state directory of a container torpor-runc restored at create: `start` has nothing to do
RESTORED_ON_CREATE = "torpor-restored-on-create"
# [runtime] state_dir/RESTORED_RECORDS/<namespace>-<container id>: torpor-runc restored that
# container at create (what it restored, one line); `torpor kube restored` reads them
RESTORED_RECORDS = "restored-on-create"

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


# runc's list of the init's stdio, which `runc restore` reads before it starts CRIU. In a
# checkpoint taken in a Kubernetes pod torpor-runc keeps it under its own name, so that a pod of
# another runtime class fails to restore it before anything runs, instead of restoring the
# memory without torpor's state (capture/pod.py).
RUNC_DESCRIPTORS = "descriptors.json"
HIDDEN_DESCRIPTORS = "torpor-descriptors.json"

# Per-container records under [runtime] state_dir (default /run/torpor)
RECORDS_DIR = "containers"                       # <state_dir>/containers/<namespace>/<id>.<key>/
CHECKPOINT_REQUEST_FORMAT = "torpor.checkpoint-request.v1"
RESTORE_PLAN = "restore-net.json"                # torpor-runc restore's network plan for the hook
LAZY_PAGES_SOCKET = "lazy-pages.socket"          # criu lazy-pages, in a lazy restore's work dir
CRIU_RESTORE_CONFIG = "criu-restore.conf"        # CRIU options runc has no flag for (tcp-close)

# Per-checkpoint journals under [runtime] state_dir (torpor.capture.journal)
CHECKPOINTS_DIR = "checkpoints"                  # <state_dir>/checkpoints/<id>/
CHECKPOINT_LOCKS_DIR = "locks"                   # <state_dir>/checkpoints/locks/<key>.lock
JOURNAL_FORMAT = "torpor.checkpoint-journal.v1"
JOURNAL = "journal.json"                         # what `torpor checkpoint` set out to do
CHECKPOINT_REQUEST = "request.json"              # `torpor checkpoint`'s options for torpor-runc
DECISION_FORMAT = "torpor.checkpoint-decision.v1"
DECISION = "decision.json"                       # commit or abort, for CRIU's post-dump hook
RUNTIME_RECORD_FORMAT = "torpor.checkpoint-runtime.v1"
RUNTIME_RECORD = "runtime.json"                  # what torpor-runc froze
PENDING_STATE = "state.pending.json"             # state.json, put in place after the dump

# OCI image layouts
OCI_LAYOUT_FILE = "oci-layout"
OCI_INDEX_FILE = "index.json"
OCI_BLOBS_DIR = "blobs"

# kubelet's checkpoint archive (containerd's and CRI-O's CRI `CheckpointContainer`), and the
# rootfs of a checkpoint OCI image, which holds the same files
KUBE_CHECKPOINT_DIR = "checkpoint"               # CRIU's images, flat
KUBE_CONFIG_DUMP = "config.dump"                 # the engine's record: id, name, base image
KUBE_SPEC_DUMP = "spec.dump"                     # the OCI runtime spec
KUBE_STATUS_DUMP = "status.dump"                 # CRI ContainerStatus (containerd 2.1+ needs it)
KUBE_ROOTFS_DIFF = "rootfs-diff.tar"             # the read-write layer (gzip, whatever the name)
KUBE_DUMP_LOG = "dump.log"                       # CRIU's log of the dump
