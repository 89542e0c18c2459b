"""What torpor-runc checkpoint saves besides CRIU's images, and with which options.

CRIU flags (from argv, with defaults from the container's annotations or the config for the
flags ctr and nerdctl cannot pass), the file policy (`torpor checkpoint`'s request, else the
annotation, else the config), the files themselves (the read-write layer, volumes, /dev/shm),
the network namespace and the process tree.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from torpor.capture import netns, records, rootfs, volumes
from torpor.shim import image_dir
from torpor.shim.argv import Invocation

if TYPE_CHECKING:
    from torpor.shim.main import Context

CRIU_FLAGS = ("tcp-established", "file-locks", "ext-unix-sk", "shell-job")


def criu_flags(inv: Invocation) -> dict[str, Any]:
    return {
        **{flag: inv.has(flag) for flag in CRIU_FLAGS},
        "empty-ns": inv.values("empty-ns"),
        "leave-running": inv.has("leave-running"),
        "manage-cgroups-mode": inv.flag("manage-cgroups-mode"),
    }


def default_flags(ctx: Context, inv: Invocation, config: dict[str, Any]) -> list[str]:
    """CRIU flags ctr and nerdctl cannot pass: from the container's annotations
    (io.torpor.checkpoint.tcp-established / file-locks = "true"), else the config."""
    annotations = config.get("annotations") or {}
    wanted = {"tcp-established": ctx.cfg.checkpoint_tcp_established,
              "file-locks": ctx.cfg.checkpoint_file_locks}
    extra = []
    for flag, default in wanted.items():
        value = annotations.get(f"io.torpor.checkpoint.{flag}")
        on = value.lower() == "true" if isinstance(value, str) else default
        if on and not inv.has(flag):
            extra.append(f"--{flag}")
    return extra


def policy(ctx: Context, request: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    annotations = config.get("annotations") or {}
    chosen = (volumes.parse_policy(request.get("volumes"))
              or volumes.parse_policy(annotations.get(volumes.ANNOTATION))
              or volumes.parse_policy(ctx.cfg.checkpoint_volumes) or "all")
    return {
        "volumes": chosen,
        "dev_shm": request.get("dev_shm", ctx.cfg.checkpoint_dev_shm),
        "rootfs": request.get("rootfs", ctx.cfg.checkpoint_rootfs),
    }



def save_files(ctx: Context, pid: int, config: dict[str, Any], chosen: dict[str, Any],
               out_dir: str) -> dict[str, Any]:
    saved: dict[str, Any] = {"rootfs": None, "volumes": [], "dev_shm": None}
    if chosen["rootfs"]:
        overlay = rootfs.root_overlay(pid)
        if overlay is None:
            ctx.log.info("the container's root is not an overlay mount: its read-write layer "
                         "is left to containerd's diff service")
        else:
            path = os.path.join(out_dir, image_dir.ROOTFS_DIFF)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as out:
                entries = rootfs.write_layer(overlay["upperdir"], out)
                saved["rootfs"] = {"archive": image_dir.ROOTFS_DIFF, "entries": entries,
                                   "bytes": out.tell()}
    selected, shm = volumes.select(config, chosen["volumes"], chosen["dev_shm"])
    for volume in selected:
        volumes.save(volume, out_dir)
        saved["volumes"].append(volume.to_dict())
    if shm is not None:
        volumes.save(shm, out_dir)
        saved["dev_shm"] = shm.to_dict()
    return saved



def process_tree(pids: list[int]) -> list[dict[str, Any]]:
    """pid, parent, name, command line and resident memory of each process, for inspect."""
    tree = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        tree.append({"pid": pid, "ns_pid": int(status.get("NSpid", str(pid)).split()[-1]),
                     "ppid": int(status.get("PPid", "0").strip()),
                     "name": status.get("Name", "").strip(), "cmdline": cmdline,
                     "rss_bytes": int(status.get("VmRSS", "0 kB").split()[0]) * 1024})
    return tree


def network_state(config: dict[str, Any], pid: int) -> dict[str, Any]:
    """The namespace's configuration (pyroute2) and the sockets' local addresses."""
    return {
        "netns_path": records.netns_path_of(config, pid),
        "created_by_runtime": records.explicit_netns(config) is None,
        "config": netns.snapshot(f"/proc/{pid}/ns/net"),
        "sockets": netns.socket_addresses(pid),
    }
