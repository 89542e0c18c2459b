"""The fake NVIDIA driver for torpor's tests: fake libcuda and libnvidia-ml, and a fake node.

The C sources sit beside this file (fake_gpu.h says how they work). A test builds them once
(`build`), describes a node's GPUs in a directory (`FakeNode`), points the process under test
at that directory with TORPOR_FAKE_GPU_DIR, and starts "CUDA processes" whose environment
comes from `process_env`.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
import uuid as uuid_module
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GIB = 1 << 30
H200 = {"name": "NVIDIA H200", "architecture": 9, "cc": "9.0", "memory_total": 143771 << 20,
        "pci_device_id": "0x233510DE"}
H100 = {"name": "NVIDIA H100 80GB HBM3", "architecture": 9, "cc": "9.0",
        "memory_total": 81559 << 20, "pci_device_id": "0x233010DE"}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "architecture": 7, "cc": "8.0",
        "memory_total": 81920 << 20, "pci_device_id": "0x20B210DE"}
DRIVER_580 = ("580.65.06", 13000)
# A call that blocks (as the real driver's do, without limit) makes the fake abort its caller
# after this long: in a test, only a call torpor failed to bound gets there.
NODE_DEFAULTS = {"block_cap_ms": 30000}
DRIVER_570 = ("570.86.10", 12080)


@dataclass
class FakeLibs:
    cuda: Path
    nvml: Path
    worker: Path


def build(out: Path) -> FakeLibs:
    """Compile the fake libraries (gcc -shared -fPIC) and the static test workload."""
    out.mkdir(parents=True, exist_ok=True)
    libs = FakeLibs(out / "libcuda.so.1", out / "libnvidia-ml.so.1", out / "gpuworker")
    for source, target in (("fake_libcuda.c", libs.cuda), ("fake_libnvidia_ml.c", libs.nvml)):
        subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                        "-o", str(target), str(HERE / source)], check=True)
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-static", "-pthread", "-o",
                    str(libs.worker), str(HERE / "gpuworker.c")], check=True)
    return libs


def new_uuid() -> str:
    return "GPU-" + str(uuid_module.uuid4())


def gpu(model: dict[str, Any], index: int, **overrides: Any) -> dict[str, Any]:
    """One GPU of `model` at `index`, persistence on, MIG off, unless overridden."""
    return {"uuid": new_uuid(), "pci_bus_id": f"00000000:{0x19 + index:02X}:00.0",
            "mig": 0, "persistence": 1, "minor": index, "memory_used": 0, **model, **overrides}


@dataclass
class Call:
    realtime_ns: int
    monotonic_ns: int
    op: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return int(self.fields.get("pid", "0"))

    @property
    def result(self) -> int:
        return int(self.fields.get("result", "0"))

    @property
    def realtime(self) -> float:
        return self.realtime_ns / 1e9


class FakeNode:
    """A directory the fakes read as one node: node.conf, failure files, calls.log."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)
        self.gpus: list[dict[str, Any]] = []
        self.driver = DRIVER_580

    def configure(self, gpus: list[dict[str, Any]], driver: tuple[str, int] = DRIVER_580,
                  **node: Any) -> None:
        """The node's GPUs and driver; `node`: restore_tid_error=304, block_cap_ms=N."""
        self.gpus, self.driver = gpus, driver
        lines = [f"driver_version={driver[0]}", f"cuda_driver_version={driver[1]}"]
        lines += [f"{key}={value}" for key, value in {**NODE_DEFAULTS, **node}.items()]
        for index, g in enumerate(gpus):
            lines += [f"gpu.{index}.{key}={value}" for key, value in g.items()]
        tmp = self.dir / "node.conf.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(self.dir / "node.conf")

    def process_env(self, token: str, gpu_index: int = 0, memory: int | list[int] = GIB, *,
                    gpus: list[int] | None = None, mps: bool = False) -> dict[str, str]:
        """The environment that makes a process a CUDA process that sees the GPUs `gpus`
        (default: GPU `gpu_index`), holding `memory` bytes on each (or the list's on each)."""
        indices = gpus if gpus is not None else [gpu_index]
        held = memory if isinstance(memory, list) else [memory] * len(indices)
        env = {"FAKE_CUDA_TOKEN": token, "FAKE_CUDA_MEM": ",".join(map(str, held)),
               "FAKE_CUDA_STATE": "R0" + ",".join(self.gpus[i]["uuid"] for i in indices)}
        if mps:
            env["FAKE_CUDA_MPS"] = "1"
        return env

    def inject(self, token: str, *rules: str) -> None:
        """Failures for a token: 'op=code', 'op=code*N' (next N calls), 'op=code!' (FAILED)."""
        (self.dir / f"{token}.fail").write_text("".join(f"{r}\n" for r in rules))

    def clear(self, token: str) -> None:
        for suffix in ("fail", "busy"):
            (self.dir / f"{token}.{suffix}").unlink(missing_ok=True)

    def set_busy(self, token: str, busy: bool = True) -> None:
        path = self.dir / f"{token}.busy"
        if busy:
            path.touch()
        else:
            path.unlink(missing_ok=True)

    def calls(self, op: str | None = None, token: str | None = None) -> list[Call]:
        try:
            text = (self.dir / "calls.log").read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            parts = line.split()
            fields = dict(p.split("=", 1) for p in parts[3:] if "=" in p)
            call = Call(int(parts[0]), int(parts[1]), parts[2], fields)
            if (op is None or call.op == op) and (token is None or fields.get("token") == token):
                out.append(call)
        return out

    def env(self) -> dict[str, str]:
        return {"TORPOR_FAKE_GPU_DIR": str(self.dir)}


def device_node(directory: Path, minor: int) -> Path:
    """A character device like the driver's /dev/nvidiaN (major 195), to bind-mount into a
    container as its GPU; nothing opens it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"nvidia{minor}"
    if not path.exists():
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
    return path


def counter(pid: int, token: str) -> tuple[int, str]:
    """The workload's progress counter and the state letter it last saw (through its root)."""
    text = Path(f"/proc/{pid}/root/tmp/counter.{token}").read_text()
    value, state = text.split()
    return int(value), state


def progressing(pid: int, token: str, seconds: float = 0.3) -> bool:
    before, _ = counter(pid, token)
    time.sleep(seconds)
    after, _ = counter(pid, token)
    return after > before


def start_worker(worker: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """The workload as a plain host process (for tests without containerd)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_CUDA_")}
    full.update(env)
    return subprocess.Popen([str(worker), *args], env=full, stdin=subprocess.DEVNULL)
