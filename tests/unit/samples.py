"""Typed sample records, filled in every field, for the format and document tests."""

from __future__ import annotations

from torpor.formats.criu import CriuOptions
from torpor.formats.files import FileEntry, FilePolicy, SavedFiles, SavedRootfs, SavedVolume, Sizes
from torpor.formats.gpu import CudaProcess, GpuDevice, GpuInventory, GpuProcessMemory, GpuState
from torpor.formats.metadata import BaseImage, CheckpointMetadata, ContainerInfo, RuntimeInfo
from torpor.formats.network import (
    Address,
    Link,
    Neighbour,
    NetnsSnapshot,
    NetworkState,
    Route,
    Rule,
    SocketAddress,
)
from torpor.formats.node import NodeFacts
from torpor.formats.oci import Descriptor
from torpor.formats.request import CheckpointRequest
from torpor.formats.state import ContainerState, ProcessInfo

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
UUID = "GPU-a0000000-0000-0000-0000-000000000000"

CRIU = CriuOptions(tcp_established=True, file_locks=True, leave_running=True,
                   empty_ns=("network",), manage_cgroups_mode="soft")
NETWORK = NetworkState(
    netns_path="/proc/42/ns/net", created_by_runtime=True,
    config=NetnsSnapshot(
        links=(Link(1, "lo", "loopback", "00:00:00:00:00:00", 65536, "up", 73),),
        addresses=(Address("lo", "inet", "127.0.0.1", 8, 254),
                   Address("lo", "inet", "10.1.2.3", 32, 0)),
        routes=(Route("inet", "10.9.0.0", 16, None, "lo", None, 254, 253, 4, 1, None),),
        rules=(Rule("inet", 255, 0, 1),),
        neighbours=(Neighbour("lo", "127.0.0.2", None, 64),)),
    sockets=(SocketAddress("tcp", "10.1.2.3", 7000, "listen"),
             SocketAddress("tcp", "0.0.0.0", 8080, "established")))
GPU = GpuState(13000, (CudaProcess(4242, 7),), GpuInventory(
    "580.65.06", 13000, True,
    (GpuDevice(0, UUID, "NVIDIA H200", "Hopper", "9.0", 140 << 30, 2 << 30, 138 << 30,
               "00000000:19:00.0", 0, "off", True),),
    (GpuProcessMemory(4242, UUID, 2 << 30),)))
STATE = ContainerState(
    torpor_version="0.1.0", container_id="web1", init_pid=42, criu=CRIU,
    policy=FilePolicy(volumes=("/data",), dev_shm=True, rootfs=True), network=NETWORK,
    files=SavedFiles(SavedRootfs("rootfs-diff.tar", 3, 10240),
                     (SavedVolume(0, "/data", "/srv/data", "dir", False, "torpor-volume-0.tar", 5),),
                     SavedVolume(-1, "/dev/shm", "/run/shm", "dir", False, "torpor-devshm.tar", 0)),
    processes=(ProcessInfo(42, 1, 0, "sh", ("sh", "-c", "loop"), 4096),),
    gpu=GPU, timings={"runc_checkpoint_s": 0.25}, frozen_by_torpor=True)
METADATA = CheckpointMetadata(
    torpor_version="0.1.0", created="2026-12-01T00:00:00Z",
    container=ContainerInfo("web1", "docker.io/library/redis:7",
                            RuntimeInfo("io.containerd.torpor.v2", "/usr/local/bin/torpor-runc"),
                            {"ociVersion": "1.1.0", "unknown": {"kept": [1, 2]}},
                            {"team": "ml"}, "overlayfs", "web1"),
    image=BaseImage("docker.io/library/redis:7",
                    Descriptor("application/vnd.oci.image.index.v1+json", D1, 100),
                    Descriptor("application/vnd.oci.image.manifest.v1+json", D2, 200,
                               {"platform": {"architecture": "amd64", "os": "linux"}}),
                    D1, (Descriptor("application/vnd.oci.image.layer.v1.tar+gzip", D2, 300),),
                    (D1,), D1),
    request=CheckpointRequest(criu=CRIU, volumes="all", dev_shm=None),
    node=NodeFacts("amd64", "6.1.0", "4.2.1", "1.1.5", 2, ("avx2", "sse4_2"), None),
    state=STATE, sizes=Sizes(1 << 20, 2 << 20, 10240), timings={"total_s": 1.5},
    files=(FileEntry("criu/pages-1.img", 1 << 20),), rootfs_in_image=False)
