"""runc's options as containerd carries them: which binary runs a container (BinaryName), and
CRIU's options for a checkpoint, in containerd's own protobuf messages (containerd.runc.v1).

containerd passes image and work paths only to runtimes named io.containerd.runc.*, and a task's
options replace the container's runtime options instead of merging with them (containerd issue
11568), so a restore must repeat BinaryName in the task options.
"""

from __future__ import annotations

import os

from google.protobuf import any_pb2

from torpor.containerd.api import containers_pb2, runc_options_pb2
from torpor.errors import CheckpointError
from torpor.formats.criu import CriuOptions
from torpor.formats.metadata import RuntimeInfo

SPEC_TYPE_URL = "types.containerd.io/opencontainers/runtime-spec/1/Spec"
RUNC_OPTIONS_TYPE_URL = "containerd.runc.v1.Options"
CHECKPOINT_OPTIONS_TYPE_URL = "containerd.runc.v1.CheckpointOptions"
RUNC_SHIM = "io.containerd.runc.v2"
TORPOR_SHIM = "io.containerd.torpor.v2"


def pack_any(type_url: str, value: bytes) -> any_pb2.Any:
    return any_pb2.Any(type_url=type_url, value=value)


def runc_options(runtime: RuntimeInfo, *, criu_image_path: str = "",
                 criu_work_path: str = "") -> any_pb2.Any:
    """containerd.runc.v1.Options for a container or a task, from torpor's RuntimeInfo."""
    options = runc_options_pb2.Options(
        binary_name=runtime.binary_name, root=runtime.root,
        systemd_cgroup=runtime.systemd_cgroup, criu_image_path=criu_image_path,
        criu_work_path=criu_work_path)
    return pack_any(RUNC_OPTIONS_TYPE_URL, options.SerializeToString())


def runtime_of(container: containers_pb2.Container) -> RuntimeInfo:
    options = runc_options_pb2.Options()
    if container.runtime.options.type_url.endswith(RUNC_OPTIONS_TYPE_URL):
        options.ParseFromString(container.runtime.options.value)
    return RuntimeInfo(name=container.runtime.name, binary_name=options.binary_name,
                       root=options.root, systemd_cgroup=options.systemd_cgroup)


def require_torpor(container: containers_pb2.Container) -> RuntimeInfo:
    """The container's runtime, when it is torpor-runc; CheckpointError when it is not."""
    runtime = runtime_of(container)
    if runtime.name == TORPOR_SHIM or "torpor" in os.path.basename(runtime.binary_name):
        return runtime
    raise CheckpointError(
        f"container {container.id} runs under {runtime.name} with "
        f"{runtime.binary_name or 'runc'}, not torpor-runc",
        hint="create it with --runtime io.containerd.torpor.v2 or the torpor runtime class")


def passes_paths(runtime: RuntimeInfo) -> bool:
    """Whether containerd gives this runtime the image and work paths of a checkpoint."""
    return runtime.name.split(".")[:3] == ["io", "containerd", "runc"]


def checkpoint_options(criu: CriuOptions, image_path: str = "",
                       work_path: str = "") -> runc_options_pb2.CheckpointOptions:
    return runc_options_pb2.CheckpointOptions(
        exit=not criu.leave_running, open_tcp=criu.tcp_established,
        external_unix_sockets=criu.ext_unix_sk, terminal=criu.shell_job,
        file_locks=criu.file_locks, empty_namespaces=list(criu.empty_ns),
        cgroups_mode=criu.manage_cgroups_mode or "", image_path=image_path, work_path=work_path)
