"""What the GPU bench needs from the host, checked before anything runs (and all `--dry-run` does).

Each check adds a fact to the report; a missing essential adds a problem (the bench does not
start with problems); a soft issue adds a note.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any

from torpor.errors import TorporError
from torpor.gpu import cuda, inventory

GIB = 1 << 30
API_MIN_CUDA = 12080  # cuDriverGetVersion of r570: the checkpoint API


@dataclass
class Preflight:
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def check_criu(pre: Preflight, criu: str, env: dict[str, str]) -> None:
    code, text = _run([criu, "--version"], env)
    pre.facts["criu"] = text.splitlines()[0] if code == 0 and text else None
    if code != 0:
        pre.problems.append(f"CRIU does not start ({criu}): {text[-300:]}")
        return
    code, text = _run([criu, "check"], env)
    # CRIU's warnings (e.g. "Can't keep kdat cache on non-tempfs") come in any order around its
    # verdict: the verdict is the last line that is not one, the warnings are kept beside it
    lines = text.splitlines()
    warnings = [line for line in lines if line.startswith("Warn")]
    verdicts = [line for line in lines if not line.startswith("Warn")]
    pre.facts["criu_check"] = verdicts[-1] if verdicts else f"exit {code}"
    if warnings:
        pre.facts["criu_check_warnings"] = warnings
    if code != 0:  # a missing feature may be one this dump never uses: the dump will tell
        pre.notes.append(f"`criu check` fails on this kernel: {text[-300:]}")


def check_gpu(pre: Preflight, args: Any, need: int) -> None:
    try:
        driver = cuda.try_load(args.cuda_library)
        inv = inventory.gather_or_none(args.nvml_library, args.cuda_library)
    except TorporError as e:
        pre.problems.append(str(e))
        return
    if driver is None or inv is None:
        pre.problems.append(f"no NVIDIA driver: {args.cuda_library} or {args.nvml_library} cannot "
                            "be loaded (this is a GPU bench)")
        return
    version = driver.driver_version()
    pre.facts["driver"] = inv.driver_version
    pre.facts["cuda_driver_version"] = version
    if version < API_MIN_CUDA:
        pre.problems.append(f"driver {inv.driver_version} has no CUDA checkpoint API (570+)")
    gpus = inv.gpus
    if args.gpu >= len(gpus):
        pre.problems.append(f"there is no GPU {args.gpu} (NVML sees {len(gpus)})")
        return
    g = gpus[args.gpu]
    pre.facts["gpu"] = {k: getattr(g, k) for k in ("index", "uuid", "name", "memory_total",
                                                   "memory_free", "persistence_mode", "mig_mode")}
    if g.memory_free < need + GIB:
        pre.problems.append(f"GPU {args.gpu} has {inventory.gib(g.memory_free)} free; the "
                            f"bench needs {inventory.gib(need)} plus 1 GiB")
    if g.mig_mode == "on":
        pre.problems.append(f"GPU {args.gpu} has MIG enabled: CUDA checkpoints do not support it")
    if not g.persistence_mode:
        pre.notes.append(f"GPU {args.gpu} has persistence mode off: the bench calls cuInit before "
                         "restoring (torpor itself requires `nvidia-smi -pm 1`)")


def check_torch(pre: Preflight, python: str) -> None:
    code, text = _run([python, "-c", "import json, torch; print(json.dumps({'torch': "
                       "torch.__version__, 'cuda': torch.cuda.is_available(), "
                       "'devices': torch.cuda.device_count()}))"])
    if code != 0:
        pre.problems.append(f"{python} cannot import torch: {text[-300:]} (give --python)")
        return
    pre.facts["torch"] = json.loads(text.splitlines()[-1])
    if not pre.facts["torch"]["cuda"]:
        pre.problems.append(f"torch in {python} sees no CUDA device")


def check_host(pre: Preflight, images: str, need: int, margin: int) -> None:
    if os.geteuid() != 0:
        pre.problems.append("run as root: CRIU needs it")
    meminfo = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            meminfo[key] = int(value.split()[0]) * 1024
    available = meminfo.get("MemAvailable", 0)
    pre.facts["host_memory_available"] = available
    if available < 2 * need + margin:
        pre.problems.append(f"{inventory.gib(available)} of host memory available; a checkpoint "
                            f"of {inventory.gib(need)} needs about twice that (the process holds "
                            "its GPU memory in host memory, and CRIU's images)")
    existing = os.path.abspath(images)
    while not os.path.exists(existing):  # the filesystem it will be made on
        existing = os.path.dirname(existing)
    stat = os.statvfs(existing)
    free = stat.f_bavail * stat.f_frsize
    pre.facts["images_dir_free"] = free
    if free < need + margin:
        pre.problems.append(f"{images} has {inventory.gib(free)} free; CRIU's images need "
                            f"{inventory.gib(need + margin)} (--images)")


def run(args: Any, criu_env: dict[str, str]) -> Preflight:
    need = int(args.gib * GIB)
    pre = Preflight()
    check_criu(pre, args.criu, criu_env)
    check_gpu(pre, args, need)
    if args.device == "cuda":
        check_torch(pre, args.python)
    check_host(pre, args.images, need, 2 * GIB if args.device == "cuda" else 0)
    return pre
