"""Calling the low-level runtime from inside torpor-runc, with the caller's global flags."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

from torpor.errors import CheckpointError
from torpor.shim.argv import Invocation


@dataclass(frozen=True)
class RuncState:
    """What `runc state` says of a container that torpor-runc needs."""

    pid: int
    bundle: str
    status: str


def global_args(inv: Invocation) -> list[str]:
    """The global flags exactly as the caller gave them (`--root R --log L ...`)."""
    return inv.argv[1:inv.command_index]


def query_args(inv: Invocation) -> list[str]:
    """The global flags for torpor's own queries: the caller's, less --log and --log-format (a
    query that fails must not write into the caller's log: runc's answer to the caller's
    command goes there)."""
    args, out, skip = global_args(inv), [], False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.lstrip("-").split("=", 1)[0]
        if arg.startswith("-") and name in ("log", "log-format"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def state(runtime: str, inv: Invocation, container_id: str) -> RuncState:
    """`runc state ID`: pid, bundle, status and rootfs of the container."""
    cmd = [runtime, *query_args(inv), "state", container_id]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CheckpointError(f"runc state {container_id} failed: "
                              f"{(proc.stderr or proc.stdout).strip()}")
    try:
        result = json.loads(proc.stdout)
        return RuncState(int(result["pid"]), str(result["bundle"]), str(result.get("status", "")))
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"runc state {container_id} printed no container state: "
                              f"{proc.stdout[:200]!r}") from None


def run(runtime: str, argv: list[str]) -> int:
    """Run the low-level runtime with our stdio and inherited fds; its exit status."""
    return subprocess.run([runtime, *argv[1:]], close_fds=False).returncode


def run_within(runtime: str, argv: list[str], limit_s: float) -> int | None:
    """`run`, bounded: None when runc was not done within `limit_s`; then runc, the CRIU it
    started and what CRIU started (torpor.deadlines) are killed."""
    from torpor.capture import deadlines

    proc = subprocess.Popen([runtime, *argv[1:]], close_fds=False,
                            preexec_fn=_die_with_parent)
    if deadlines.wait(proc, limit_s) is None:
        return None
    return proc.returncode


def _die_with_parent() -> None:
    """In the child: SIGKILL when torpor-runc dies (the shim kills it when containerd's call
    times out), so that no runc restore, and no container, goes on that nobody manages."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


def delete_force(runtime: str, inv: Invocation, container_id: str) -> None:
    """`runc delete --force ID`: what a killed runc left of the container (its state, its
    cgroup and processes in it), gone; quietly, within 30 s."""
    root = inv.global_flag("root") or "/run/runc"
    state_dir = os.path.join(root, container_id)
    safe = bool(container_id) and "/" not in container_id and container_id not in (".", "..")
    if safe:  # runc restore mounts the rootfs at criu-root for CRIU, and unmounts it after
        from torpor.capture import deadlines

        deadlines.unmount_under(os.path.realpath(state_dir) + "/")
    argv = [runtime, *query_args(inv), "delete", "--force", container_id]
    try:
        subprocess.run(argv, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pass
    # killed before it wrote its state.json, runc no longer knows the container (delete says
    # "does not exist") but would refuse the name ("already exists"): its directory, which this
    # call made (runc refuses to restore over an existing one), goes too
    if safe:
        import shutil

        if os.path.isdir(state_dir) and not os.path.exists(os.path.join(state_dir, "state.json")):
            shutil.rmtree(state_dir, ignore_errors=True)
