"""`torpor check [REF]`: would a checkpoint and a restore work here, now?

Asked the way they will run: containerd answering at the address given; the runtime class
torpor in the config that containerd was started with; the shim launcher
(containerd-shim-torpor-v2) and torpor-runc where containerd finds them; the runc and CRIU that
runtime runs (node/runtime.py: containerd's own PATH); cgroups; with REF, the registry (a push
started and cancelled); GPUs. Each requirement is ok, warn, fail or skip, with a detail, and a
failure with the command that fixes it; the verdict is `ready` when nothing failed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from torpor import config
from torpor.errors import TorporError
from torpor.formats.metadata import RuntimeInfo
from torpor.formats.node import Requirement
from torpor.node import facts as node
from torpor.node import runtime as runtime_tools
from torpor.ops.access import RegistryAccess

CRIU_MIN = (4, 2)
RUNC_MIN = (1, 1)
CONTAINERD_MIN = (1, 6)
DEFAULT_CONTAINERD_CONFIG = "/etc/containerd/config.toml"
RUNC_SHIM = "io.containerd.runc.v2"


def _version_req(name: str, have: tuple[int, ...], need: tuple[int, ...], missing: str,
                 fix: str = "", where: str = "") -> Requirement:
    if not have:
        return Requirement(name, "fail", missing, fix)
    text = node.version_str(have) + (f" ({where})" if where else "")
    if have[: len(need)] < need:
        return Requirement(name, "fail", f"{text} is too old, "
                           f"{'.'.join(map(str, need))} or newer is needed", fix)
    return Requirement(name, "ok", text)


def check_criu(criu: str | None, path: str | None = None) -> list[Requirement]:
    """CRIU as runc finds it: on `path` (containerd's PATH) when given."""
    found = node.which("criu") if path is None else (criu or None)
    elsewhere = node.which("criu")
    if found is None and elsewhere:
        return [Requirement(
            "criu", "fail", f"{elsewhere} is outside containerd's PATH ({path}): runc will not "
            "find it", fix=f"ln -s {elsewhere} /usr/local/bin/criu (or add "
            f"{os.path.dirname(elsewhere)} to containerd's PATH) and restart containerd")]
    version = node.criu_version(found) if found else ()
    req = _version_req("criu", version, CRIU_MIN, "not found",
                       fix="packaging/install-deps.sh (builds CRIU 4.2.1)", where=found or "")
    out = [req]
    if req.status != "ok" or found is None:
        return out
    code, text = node._run(found, "check")
    out.append(Requirement("criu check", "ok" if code == 0 else "fail",
                           text.splitlines()[-1] if text else f"exit {code}",
                           "" if code == 0 else f"{found} check --all: see what the kernel lacks"))
    code, text = node._run(found, "check", "--feature", "uffd-noncoop")
    if code != 0:
        out.append(Requirement("uffd (lazy restore)", "warn",
                               "not supported: lazy restore unavailable"))
    elif node.criu_lazy_pages_waits(found):
        out.append(Requirement("uffd (lazy restore)", "ok",
                               "supported; criu lazy-pages sleeps while pages arrive "
                               "(torpor's CRIU build)"))
    else:
        out.append(Requirement(
            "uffd (lazy restore)", "warn", f"supported, but {found} is not torpor's build: "
            "its lazy-pages holds a whole core until a lazy restore's last page is in",
            fix="packaging/install-deps.sh (builds CRIU 4.2.1 with torpor's patch, "
                "docs/lazy.md)"))
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


def check_containerd(address: str, namespace: str) -> Requirement:
    from torpor.containerd.client import Client

    try:
        with Client(address, namespace) as client:
            version = client.version().version
    except TorporError as e:
        unreachable = "cannot reach containerd" in e.message
        return Requirement("containerd", "fail", f"nothing answers at {address}" if unreachable
                           else e.message,
                           fix="systemctl start containerd, or give the socket it listens on "
                               "with --address (CONTAINERD_ADDRESS)")
    return _version_req("containerd", node.parse_version(version), CONTAINERD_MIN, "",
                        fix="upgrade containerd", where=address)


def containerd_config_path(address: str) -> str:
    """The config file the containerd at `address` was started with (--config, -c)."""
    pid = runtime_tools.containerd_pid(address)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [a.decode(errors="replace") for a in f.read().split(b"\0")]
    except (OSError, TypeError):
        return DEFAULT_CONTAINERD_CONFIG
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return DEFAULT_CONTAINERD_CONFIG


def check_runtime(address: str) -> tuple[list[Requirement], str]:
    """The runtime class, the shim launcher and torpor-runc as containerd finds them; and the
    torpor-runc a restore runs (for the runc and CRIU checks)."""
    from torpor.runtime_config import containerd as containerd_config

    out = []
    env = runtime_tools.containerd_environ(address)
    path = (env or {}).get("PATH") or os.environ.get("PATH", "")
    if env is None:
        out.append(Requirement("containerd's PATH", "warn",
                               "containerd's environment could not be read: this shell's PATH "
                               "stands in for it"))
    here = os.path.dirname(os.path.realpath(sys.argv[0]))
    config_path = containerd_config_path(address)
    binary = containerd_config.configured_binary(config_path)
    if binary is None:
        out.append(Requirement(
            "torpor runtime", "fail", f"{config_path} has no runtime class torpor",
            fix=f"torpor runtime-config containerd --install {config_path} && "
                "systemctl restart containerd"))
    elif not os.access(binary, os.X_OK):
        out.append(Requirement(
            "torpor runtime", "fail", f"{config_path}: its BinaryName {binary} is not an "
            "executable", fix=f"torpor runtime-config containerd --install {config_path} "
            "--binary /path/to/torpor-runc && systemctl restart containerd"))
    else:
        out.append(Requirement("torpor runtime", "ok",
                               f"runtime class torpor in {config_path}: {binary}"))
    launcher = runtime_tools.runtime_binary(RuntimeInfo(runtime_tools.TORPOR_SHIM), path)
    if launcher and os.access(launcher, os.X_OK):
        out.append(Requirement("shim launcher", "ok",
                               f"{os.path.dirname(launcher)}/{runtime_tools.SHIM_LAUNCHER}"))
    else:
        beside = os.path.join(here, runtime_tools.SHIM_LAUNCHER)
        source = beside if os.path.exists(beside) else f"PREFIX/bin/{runtime_tools.SHIM_LAUNCHER}"
        out.append(Requirement(
            "shim launcher", "fail", f"{runtime_tools.SHIM_LAUNCHER} is not on containerd's "
            f"PATH ({path}): ctr run --runtime {runtime_tools.TORPOR_SHIM} fails",
            fix=f"make install, or ln -s {source} /usr/local/bin/"))
    torpor_runc = binary if binary and os.access(binary, os.X_OK) else \
        launcher if launcher and os.access(launcher, os.X_OK) else ""
    if not torpor_runc and os.access(os.path.join(here, "torpor-runc"), os.X_OK):
        torpor_runc = os.path.join(here, "torpor-runc")
    if torpor_runc:
        hook = os.path.join(os.path.dirname(os.path.realpath(torpor_runc)), "torpor-hook")
        out.append(Requirement("torpor-runc", "ok", torpor_runc))
        out.append(Requirement("torpor-hook", "ok" if os.access(hook, os.X_OK) else "fail",
                               hook if os.access(hook, os.X_OK) else f"{hook} is missing",
                               "" if os.access(hook, os.X_OK) else "make install"))
    else:
        out.append(Requirement("torpor-runc", "fail", "not found where containerd looks",
                               fix="make install"))
    return out, torpor_runc


def check_registry(ref: str, cfg: config.Config, access: RegistryAccess) -> Requirement:
    from torpor.ops.sources import registry_options
    from torpor.registry import EarlyBlobs

    try:
        early = EarlyBlobs(ref, registry_options(cfg, ref, access))
        try:
            early.check_access()
        finally:
            early.__exit__(None, None, None)
    except TorporError as e:
        return Requirement("registry", "fail", f"push to {ref}: {e.message}",
                           fix=e.hint or "check the registry's address and credentials")
    return Requirement("registry", "ok", f"push to {ref} allowed")


def run(cfg: config.Config | None = None, address: str = "/run/containerd/containerd.sock",
        namespace: str = "default", ref: str | None = None,
        access: RegistryAccess | None = None) -> tuple[list[Requirement], str]:
    cfg = cfg or config.load()
    reqs = [check_containerd(address, namespace)]
    runtime_reqs, torpor_runc = check_runtime(address)
    reqs += runtime_reqs
    found = runtime_tools.tools(address, RuntimeInfo(RUNC_SHIM, torpor_runc)) \
        if torpor_runc else None
    runc = found.runc_version if found else "unknown"
    reqs.append(_version_req(
        "runc", node.parse_version(runc) if runc != "unknown" else (), RUNC_MIN,
        "torpor-runc finds no runc that runs" if torpor_runc else "not checked: no torpor-runc",
        fix="install runc on containerd's PATH, or set [runtime] path in the torpor config "
            "(TORPOR_CONFIG or /etc/torpor/config.toml) to its absolute path",
        where=f"as {torpor_runc} runs it" if torpor_runc else ""))
    path = found.path if found else (runtime_tools.containerd_environ(address) or {}).get("PATH")
    reqs.extend(check_criu(found.criu if found else None, path))
    cgroup = node.cgroup_version()
    reqs.append(Requirement("cgroup", "ok" if cgroup in (1, 2) else "fail",
                            f"v{cgroup}" if cgroup else "no cgroup filesystem at /sys/fs/cgroup",
                            "" if cgroup else "mount -t cgroup2 none /sys/fs/cgroup"))
    if ref:
        reqs.append(check_registry(ref, cfg, access or RegistryAccess()))
    reqs.extend(check_gpu(cfg))
    verdict = "ready" if all(r.status != "fail" for r in reqs) else "not ready"
    return reqs, verdict


def as_json(reqs: list[Requirement], verdict: str) -> dict[str, Any]:
    return {"verdict": verdict, "requirements": [r.to_json() for r in reqs]}
