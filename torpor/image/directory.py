"""The local checkpoint directory that `torpor checkpoint -o DIR` writes and `torpor restore`
reads (docs/checkpoint.md describes it for users):

    DIR/                      0700
      checkpoint.json         metadata (torpor.formats.metadata.CheckpointMetadata)
      criu/                   CRIU's images, as runc left them, plus criu/torpor/ from torpor-runc
                              (state.json, volumes/, devshm.tar)
      rootfs-diff.tar         the read-write layer: an OCI layer (uncompressed tar, whiteouts)
      criu-dump.log           CRIU's log of the dump

A restore checks the directory against checkpoint.json (every file there, with its size) before
touching containerd, and never writes into it.
"""

from __future__ import annotations

import os

from torpor.archive import safe_name
from torpor.atomicfile import write_atomic
from torpor.errors import FormatError, RestoreError, UnsafeArchive
from torpor.formats import names
from torpor.formats.files import FileEntry
from torpor.formats.metadata import CheckpointMetadata


def is_checkpoint_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, names.CHECKPOINT_METADATA))


def inventory(directory: str) -> tuple[FileEntry, ...]:
    """Every regular file below `directory` with its size, sorted, relative paths."""
    files = []
    for root, dirs, filenames in os.walk(directory):
        dirs.sort()
        for name in sorted(filenames):
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                files.append(FileEntry(os.path.relpath(path, directory), os.path.getsize(path)))
    return tuple(files)


def write_metadata(directory: str, metadata: CheckpointMetadata) -> None:
    write_atomic(os.path.join(directory, names.CHECKPOINT_METADATA), metadata.dumps(), mode=0o600)


def read_metadata(directory: str) -> CheckpointMetadata:
    """checkpoint.json, parsed and checked, without looking at the other files."""
    path = os.path.join(directory, names.CHECKPOINT_METADATA)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise RestoreError(f"{directory} is not a torpor checkpoint: no "
                           f"{names.CHECKPOINT_METADATA}") from None
    except OSError as e:
        raise RestoreError(f"{path} is unreadable: {e.strerror}") from None
    try:
        return CheckpointMetadata.loads(data, path)
    except FormatError as e:
        raise RestoreError(str(e), hint=e.hint) from None


def load(directory: str) -> CheckpointMetadata:
    """checkpoint.json, after checking that every file it lists is there, whole."""
    metadata = read_metadata(directory)
    path = os.path.join(directory, names.CHECKPOINT_METADATA)
    problems = []
    for entry in metadata.files:
        try:
            safe_name(entry.path, "file")
        except UnsafeArchive as e:
            raise RestoreError(f"{path} lists an unsafe path: {e}") from None
        full = os.path.join(directory, entry.path)
        try:
            size = os.path.getsize(full)
        except OSError:
            problems.append(f"{entry.path} is missing")
            continue
        if size != entry.size:
            problems.append(f"{entry.path} is {size} bytes, the checkpoint wrote {entry.size}")
    if problems:
        shown = "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)"
                                           if len(problems) > 5 else "")
        raise RestoreError(f"the checkpoint in {directory} is incomplete or damaged: {shown}")
    return metadata
