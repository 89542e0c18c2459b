"""torpor-runc's record of one checkpoint, `<image-path>/torpor-state.json`: what CRIU does not
save (network, files, GPU state) and the CRIU options a restore must repeat. Written last, so
its presence means torpor-runc finished; containerd tars the image directory, so this travels
inside ctr's and nerdctl's checkpoints too."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from torpor.atomicfile import write_atomic
from torpor.errors import FormatError
from torpor.formats import names
from torpor.formats.criu import CriuOptions
from torpor.formats.fields import Fields, check_format
from torpor.formats.files import FilePolicy, SavedFiles
from torpor.formats.gpu import GpuState
from torpor.formats.network import NetworkState


@dataclass(frozen=True)
class ProcessInfo:
    """One process of the container at checkpoint time, for `torpor inspect`."""

    pid: int
    ns_pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    rss_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "ns_pid": self.ns_pid, "ppid": self.ppid, "name": self.name,
                "cmdline": list(self.cmdline), "rss_bytes": self.rss_bytes}

    @classmethod
    def from_json(cls, f: Fields) -> ProcessInfo:
        return cls(pid=f.integer("pid"), ns_pid=f.integer("ns_pid"), ppid=f.integer("ppid", 0),
                   name=f.string("name", ""), cmdline=tuple(f.strings("cmdline")),
                   rss_bytes=f.integer("rss_bytes", 0))


@dataclass(frozen=True)
class ContainerState:
    torpor_version: str
    container_id: str
    init_pid: int
    criu: CriuOptions
    policy: FilePolicy
    network: NetworkState
    files: SavedFiles = field(default_factory=SavedFiles)
    processes: tuple[ProcessInfo, ...] = ()
    gpu: GpuState | None = None
    timings: dict[str, float] = field(default_factory=dict)
    frozen_by_torpor: bool = False
    spec_seal: str = ""     # this node's HMAC of the spec's requests (capture.restore_policy)

    def to_json(self) -> dict[str, Any]:
        return {"format": names.CONTAINER_STATE_FORMAT, "torpor_version": self.torpor_version,
                "container_id": self.container_id, "init_pid": self.init_pid,
                "criu": self.criu.to_json(), "policy": self.policy.to_json(),
                "network": self.network.to_json(), "files": self.files.to_json(),
                "processes": [p.to_json() for p in self.processes],
                "gpu": self.gpu.to_json() if self.gpu else None, "timings": self.timings,
                "frozen_by_torpor": self.frozen_by_torpor, "spec_seal": self.spec_seal}

    @classmethod
    def from_json(cls, f: Fields) -> ContainerState:
        check_format(f, names.CONTAINER_STATE_FORMAT)
        gpu = f.optional_child("gpu")
        return cls(torpor_version=f.string("torpor_version", ""),
                   container_id=_container_id(f), init_pid=f.integer("init_pid", 0),
                   criu=CriuOptions.from_json(f.child("criu")),
                   policy=FilePolicy.from_json(f.child("policy")),
                   network=NetworkState.from_json(f.child("network")),
                   files=SavedFiles.from_json(f.child("files")),
                   processes=tuple(ProcessInfo.from_json(p) for p in f.children("processes")),
                   gpu=GpuState.from_json(gpu) if gpu else None, timings=f.numbers("timings"),
                   frozen_by_torpor=f.boolean("frozen_by_torpor", False),
                   spec_seal=f.string("spec_seal", ""))

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode()

    @classmethod
    def loads(cls, data: bytes, what: str) -> ContainerState:
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise FormatError(f"{what} is not valid JSON: {e}") from None
        return cls.from_json(Fields(document, what))


def state_path(image_path: str) -> str:
    return os.path.join(image_path, names.CONTAINER_STATE)


def write(image_path: str, state: ContainerState) -> None:
    """<image-path>/torpor-state.json, atomically and private (0600)."""
    write_atomic(state_path(image_path), state.dumps(), mode=0o600)


def read(image_path: str) -> ContainerState | None:
    """torpor-runc's state in an image directory; None when there is none (a checkpoint made
    by plain runc, or an unfinished one)."""
    path = state_path(image_path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise FormatError(f"cannot read {path}: {e.strerror}") from None
    return ContainerState.loads(data, path)


def _container_id(f: Fields) -> str:
    value = f.string("container_id", "")
    return names.check_identifier(value, f"{f.what}: the container id") if value else ""
