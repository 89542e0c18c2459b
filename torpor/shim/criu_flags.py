"""CRIU's options as runc's argv carries them, and the ones torpor adds.

ctr and nerdctl cannot ask for --tcp-established or --file-locks; a container's annotations
(io.torpor.checkpoint.tcp-established / file-locks = "true"), else the config, add them.
kubelet cannot either: in a pod, --tcp-established is on unless an annotation says "false", so
that a checkpoint of a server with clients connected succeeds (restore closes what the pod's new
address cannot carry, capture/pod.py).
"""

from __future__ import annotations

from torpor.config import Config
from torpor.formats import annotations as ann
from torpor.formats.criu import RESTORE_FLAGS, CriuOptions
from torpor.formats.oci import OciSpec
from torpor.shim.argv import Invocation


def criu_options(inv: Invocation) -> CriuOptions:
    """What `runc checkpoint` will give CRIU, read from its argv."""
    present = {flag for flag in (*RESTORE_FLAGS, "leave-running") if inv.has(flag)}
    return CriuOptions.from_flags(present, inv.values("empty-ns"), inv.flag("manage-cgroups-mode"))


def default_flags(cfg: Config, inv: Invocation, spec: OciSpec, in_pod: bool = False) -> list[str]:
    """Flags to add because the container's annotations or the config ask for them."""
    annotations = spec.get("annotations") or {}
    wanted = {"tcp-established": (ann.CHECKPOINT_TCP_ESTABLISHED,
                                  in_pod or cfg.checkpoint_tcp_established),
              "file-locks": (ann.CHECKPOINT_FILE_LOCKS, cfg.checkpoint_file_locks)}
    extra = []
    for flag, (key, default) in wanted.items():
        value = annotations.get(key)
        on = value.lower() == "true" if isinstance(value, str) else default
        if on and not inv.has(flag):
            extra.append(f"--{flag}")
    return extra
