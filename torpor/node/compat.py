"""Can this node restore a checkpoint? Every mismatch, in words, before any large download.

Compared with what the checkpoint recorded of its node: architecture, kernel, CPU features
(every feature the checkpoint's node had, as CRIU's cpuinfo check does), CRIU and runc versions
(the same or newer), cgroup version, and GPUs (count, model, driver, free memory, MIG) when the
checkpoint holds GPU state.
"""

from __future__ import annotations

from torpor.config import Config
from torpor.errors import IncompatibleNode
from torpor.formats.metadata import CheckpointMetadata
from torpor.formats.node import NodeFacts
from torpor.node import facts as node

# CPU flags that say how the kernel runs, not what the CPU can do: they may differ freely.
VOLATILE_CPU_FLAGS = {"hypervisor", "tsc_known_freq", "nonstop_tsc", "constant_tsc",
                      "tsc_reliable", "rep_good", "nopl", "xtopology", "cpuid", "tsc_adjust"}


def _older(have: str, need: str, parts: int = 2) -> bool:
    have_v, need_v = node.parse_version(have), node.parse_version(need)
    return bool(have_v and need_v) and have_v[:parts] < need_v[:parts]


def mismatches(recorded: NodeFacts, here: NodeFacts) -> list[str]:
    found = []
    if recorded.architecture and recorded.architecture != here.architecture:
        found.append(f"architecture: the checkpoint is {recorded.architecture}, this node is "
                     f"{here.architecture}")
    if recorded.kernel and _older(here.kernel, recorded.kernel):
        found.append(f"kernel: this node runs {here.kernel}, older than the checkpoint's "
                     f"{recorded.kernel}")
    missing = sorted(set(recorded.cpu_flags) - set(here.cpu_flags) - VOLATILE_CPU_FLAGS)
    if missing:
        shown = ", ".join(missing[:12]) + (f" and {len(missing) - 12} more" if len(missing) > 12
                                           else "")
        found.append(f"CPU features: this node lacks {shown}")
    for tool, have in (("criu", here.criu_version), ("runc", here.runc_version)):
        need = getattr(recorded, f"{tool}_version")
        if need and need != "unknown" and (have == "unknown" or _older(have, need, 3)):
            has = f"has {have}" if have != "unknown" else f"has none that runs (no {tool} on PATH?)"
            found.append(f"{tool}: this node {has}, the checkpoint needs {need} or newer")
    if recorded.cgroup_version and recorded.cgroup_version != here.cgroup_version:
        found.append(f"cgroups: the checkpoint is from cgroup v{recorded.cgroup_version}, this "
                     f"node runs v{here.cgroup_version}")
    return found


def check(metadata: CheckpointMetadata, cfg: Config, here: NodeFacts | None = None) -> None:
    """Raise IncompatibleNode listing every reason this node cannot restore `metadata`."""
    here = here or node.gather(runc=node.low_level_runc(cfg.runtime_path))
    found = mismatches(metadata.node, here)
    gpu = metadata.state.gpu
    if gpu is not None:
        from torpor.gpu import compat as gpu_compat
        from torpor.gpu import inventory

        current = inventory.gather_or_none(cfg.gpu_nvml_library, cfg.gpu_cuda_library)
        # the GPUs the restored container will be given are not known yet: all of this node's
        # (torpor-runc checks again against the container's own when it restores)
        found += gpu_compat.mismatches(gpu.inventory, current, gpu.visible_gpus)
    if found:
        raise IncompatibleNode(found)
