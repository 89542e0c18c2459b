"""The local checkpoint directory that `torpor checkpoint -o DIR` writes and `torpor restore`
reads (docs/checkpoint.md describes it for users):

    DIR/                      0700
      checkpoint.json         metadata (torpor.formats.metadata.CheckpointMetadata)
      criu/                   CRIU's images, as runc left them, plus torpor-runc's flat files
                              (torpor-state.json, torpor-volume-N.tar, torpor-devshm.tar)
      rootfs-diff.tar         the read-write layer: an OCI layer (uncompressed tar, whiteouts)
      criu-dump.log           CRIU's log of the dump

A restore checks the directory against checkpoint.json before touching containerd, and never
writes into it: every file it lists must be there with its size, and nothing else may be: no
file it does not list, no symlink (CRIU would read a host file through it), no device, FIFO or
socket. `make_private` gives a new checkpoint directory modes 0600 (files) and 0700 (folders).
"""

from __future__ import annotations

import os
import stat

from torpor.archive import safe_name
from torpor.atomicfile import write_atomic
from torpor.errors import FormatError, RestoreError, UnsafeArchive
from torpor.formats import names
from torpor.formats.files import FileEntry
from torpor.formats.metadata import CheckpointMetadata

MAX_METADATA_BYTES = 64 << 20


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
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_METADATA_BYTES + 1)
    except FileNotFoundError:
        raise RestoreError(f"{directory} is not a torpor checkpoint: no "
                           f"{names.CHECKPOINT_METADATA}") from None
    except OSError as e:
        raise RestoreError(f"{path} is unreadable (a symlink?): {e.strerror}") from None
    if len(data) > MAX_METADATA_BYTES:
        raise RestoreError(f"{path} is more than {MAX_METADATA_BYTES} bytes: refused")
    try:
        return CheckpointMetadata.loads(data, path)
    except FormatError as e:
        raise RestoreError(str(e), hint=e.hint) from None


def make_private(directory: str) -> None:
    """Files 0600 and directories 0700 below `directory` (CRIU writes its images 0644)."""
    os.chmod(directory, 0o700)
    for root, dirs, filenames in os.walk(directory):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
        for name in filenames:
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                os.chmod(path, 0o600)


def strays(directory: str, listed: set[str], max_files: int) -> list[str]:
    """What is below `directory` besides the listed files and their folders: links, devices,
    unlisted files (CRIU would read them, or read through them)."""
    found: list[str] = []
    seen = 0
    for root, dirs, filenames in os.walk(directory):
        for name in [*dirs, *filenames]:
            seen += 1
            if seen > max_files:
                return [*found, f"more than {max_files} entries"]
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                found.append(f"{rel} is a symlink")
            elif stat.S_ISDIR(st.st_mode):
                continue
            elif not stat.S_ISREG(st.st_mode):
                found.append(f"{rel} is a device, FIFO or socket")
            elif rel not in listed and rel != names.CHECKPOINT_METADATA:
                found.append(f"{rel} is not a file the checkpoint lists")
    return found


def load(directory: str, max_files: int = 1_000_000) -> CheckpointMetadata:
    """checkpoint.json, after checking that every file it lists is there, whole, and that
    nothing else is."""
    metadata = read_metadata(directory)
    path = os.path.join(directory, names.CHECKPOINT_METADATA)
    problems = strays(directory, {f.path for f in metadata.files}, max_files)
    for entry in metadata.files:
        try:
            safe_name(entry.path, "file")
        except UnsafeArchive as e:
            raise RestoreError(f"{path} lists an unsafe path: {e}") from None
        full = os.path.join(directory, entry.path)
        try:
            size = os.lstat(full).st_size
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
