"""`torpor check`: is this node ready to run, checkpoint and restore containers with torpor?

Each requirement yields a Requirement with a status (ok, warn, fail, skip) and a detail a user
can act on; the verdict is `ready` when nothing failed.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from torpor import config
from torpor.formats.node import Requirement
from torpor.node import facts as node

CRIU_MIN = (4, 2)
RUNC_MIN = (1, 1)
CONTAINERD_MIN = (1, 6)


def _version_req(name: str, have: tuple[int, ...], need: tuple[int, ...], missing: str) -> Requirement:
    if not have:
        return Requirement(name, "fail", missing)
    text = node.version_str(have)
    if have[: len(need)] < need:
        return Requirement(name, "fail", f"{text} is too old, {'.'.join(map(str, need))} or newer is needed")
    return Requirement(name, "ok", text)


def check_criu(criu: str | None) -> list[Requirement]:
    version = node.criu_version(criu)
    req = _version_req("criu", version, CRIU_MIN,
                       "not found: run packaging/install-deps.sh (builds CRIU 4.2.1)")
    out = [req]
    if req.status != "ok":
        return out
    binary = criu or node.which("criu") or "criu"
    code, text = node._run(binary, "check")
    out.append(Requirement("criu check", "ok" if code == 0 else "fail",
                           text.splitlines()[-1] if text else f"exit {code}"))
    code, text = node._run(binary, "check", "--feature", "uffd-noncoop")
    out.append(Requirement("uffd (lazy restore)", "ok" if code == 0 else "warn",
                           "supported" if code == 0 else "not supported: lazy restore unavailable"))
    return out


def check_gpu(cfg: config.Config) -> list[Requirement]:
    """GPUs, driver, persistence mode, MIG: what NVML reports, through torpor's inventory."""
    from torpor.errors import GpuError
    from torpor.gpu import inventory
    from torpor.gpu.criu_plugin import installed_cuda_plugin

    try:
        inv = inventory.gather_or_none(cfg.gpu_nvml_library, cfg.gpu_cuda_library)
    except GpuError as e:
        return [Requirement("gpus", "fail", str(e))]
    out = inventory.requirements(inv)
    plugin = installed_cuda_plugin()
    if inv is not None or plugin:
        out.append(Requirement("criu cuda plugin", "fail" if plugin else "ok",
                               f"{plugin} would act on the GPUs beside torpor: remove it"
                               if plugin else "not installed (torpor drives the driver)"))
    return out


def run(cfg: config.Config | None = None) -> tuple[list[Requirement], str]:
    cfg = cfg or config.load()
    reqs: list[Requirement] = []
    reqs.append(_version_req("containerd", node.containerd_version(), CONTAINERD_MIN,
                             "not found: apt-get install containerd"))
    runtime = cfg.runtime_path
    runc = runtime if os.path.isabs(runtime) else (node.which(runtime) or None)
    reqs.append(_version_req("runc", node.runc_version(runc) if runc else (), RUNC_MIN,
                             f"{runtime!r} not found: apt-get install runc"))
    reqs.extend(check_criu(None))
    cgroup = node.cgroup_version()
    reqs.append(Requirement("cgroup", "ok" if cgroup in (1, 2) else "fail",
                            f"v{cgroup}" if cgroup else "no cgroup filesystem at /sys/fs/cgroup"))
    for tool in ("torpor-runc", "torpor-hook"):
        path = shutil.which(tool)
        reqs.append(Requirement(tool, "ok" if path else "warn",
                                path or "not on PATH (containerd needs its absolute path)"))
    reqs.extend(check_gpu(cfg))
    verdict = "ready" if all(r.status != "fail" for r in reqs) else "not ready"
    return reqs, verdict


def as_json(reqs: list[Requirement], verdict: str) -> dict[str, Any]:
    return {"verdict": verdict, "requirements": [r.to_json() for r in reqs]}
