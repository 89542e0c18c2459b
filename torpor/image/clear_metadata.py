"""What an encrypted checkpoint keeps in the clear: the part of its metadata a node needs to
decide, before it has a key or downloads a layer, whether it can restore it.

Kept in the clear (the state manifest's config): the format and torpor version, creation time,
the container's id, image name, runtime and snapshotter; the base image (name, digests,
layers); the checkpoint request (CRIU options, volume policy); the node facts (architecture,
kernel, CPU features, CRIU, runc, cgroup, NVIDIA driver); CRIU's options and the file policy
torpor-runc recorded; the GPU state (inventory, each CUDA process's memory); sizes, timings,
and the list of files with their sizes (what the layers unpack to, checked against the limits).

Only in the encrypted metadata layer: the OCI runtime spec (environment variables, command line,
mounts, hooks), the container's labels, the process list (command lines), the network state
(addresses, routes, sockets), and the saved volumes' host paths.
"""

from __future__ import annotations

from dataclasses import replace

from torpor.formats.files import SavedFiles
from torpor.formats.metadata import CheckpointMetadata
from torpor.formats.network import NetworkState


def redact(metadata: CheckpointMetadata) -> CheckpointMetadata:
    """`metadata` with only what stays in the clear."""
    state = metadata.state
    files = state.files
    clear_files = SavedFiles(
        rootfs=files.rootfs,
        volumes=tuple(replace(v, source="") for v in files.volumes),
        dev_shm=replace(files.dev_shm, source="") if files.dev_shm else None)
    return replace(
        metadata,
        container=replace(metadata.container, spec={}, labels={}),
        state=replace(state, processes=(), files=clear_files,
                      network=NetworkState(netns_path="", created_by_runtime=False)))
