"""torpor-runc restore: put back what CRIU does not restore, around `runc restore`.

The steps, in order:

 1. write torpor's hooks into the restore-time spec (as for create);
 2. read torpor/state.json from the image directory (none: a plain runc checkpoint, handed over);
 3. put back the CRIU flags containerd does not repeat on restore (tcp-established,
    file-locks, ext-unix-sk, shell-job), as they were at checkpoint time;
 4. GPU: refuse early when this node cannot take the GPU state (free memory, model, driver);
 5. network: into a namespace runc creates, leave a plan for torpor-hook, which runc runs at
    CRIU's setup-namespaces step (lo up, recorded addresses and routes, before sockets are
    bound again); into an existing namespace (a path), check that the addresses the sockets
    need are there, or add them when the annotation io.torpor.restore.add-addresses is "true";
 6. files: the read-write layer (when it travelled in the image directory, as with ctr),
    volumes and /dev/shm, into the restore-time rootfs and bind sources;
 7. `runc restore` with the caller's argv plus the flags of step 3;
 8. GPU: restore each CUDA process (GPU UUID pairs when this node's GPUs differ), then unlock.
    If that fails, the restored container is killed: a restore succeeds whole or not at all.

The checkpoint is only read, never changed.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

from torpor import archive
from torpor.capture import netns, records, volumes
from torpor.capture.freezer import Cgroup
from torpor.errors import RestoreError
from torpor.shim import criu_log, image_dir, lowlevel, modifiers, runc, spec
from torpor.shim.capture import CRIU_FLAGS
from torpor.shim.create_cmd import spec_modifiers

if TYPE_CHECKING:
    from torpor.shim.main import Context

ADD_ADDRESSES = "io.torpor.restore.add-addresses"


def read_state(image_path: str) -> dict[str, Any] | None:
    try:
        state = image_dir.read_state(image_path)
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise RestoreError(f"{image_path}/torpor/state.json is unreadable: {e}") from None
    if state is not None and state.get("format") != image_dir.FORMAT:
        raise RestoreError(f"{image_path}/torpor/state.json has format {state.get('format')!r}, "
                           f"this torpor reads {image_dir.FORMAT!r}")
    return state


def extra_flags(inv: Any, state: dict[str, Any]) -> list[str]:
    recorded = state.get("criu_flags") or {}
    return [f"--{flag}" for flag in CRIU_FLAGS if recorded.get(flag) and not inv.has(flag)]


def prepare_network(ctx: Context, config: dict[str, Any], state: dict[str, Any],
                    plan_path: str) -> None:
    network = state.get("network") or {}
    needed = netns.needed_addresses(network.get("sockets") or [])
    add = (config.get("annotations") or {}).get(ADD_ADDRESSES, "").lower() == "true"
    path = records.explicit_netns(config)
    if path:
        if not os.path.exists(path):
            raise RestoreError(f"the network namespace {path} in the spec does not exist")
        missing = netns.missing_addresses(path, needed)
        if missing and not add:
            raise RestoreError(
                f"the network namespace {path} lacks the addresses the checkpointed sockets are "
                f"bound to: {', '.join(missing)}",
                hint=f"give the namespace these addresses, or set the annotation {ADD_ADDRESSES}"
                "=true (torpor restore --add-addresses) to add them")
        if missing:
            netns.add_addresses(path, missing, network.get("config") or {})
        return
    plan = netns.restore_plan(network.get("config") or {})
    lo_only = {a["address"] for a in plan["addresses"]}
    foreign = [a for a in needed if a not in lo_only]
    if foreign and not add:
        raise RestoreError(
            f"the checkpointed sockets are bound to {', '.join(foreign)}, which a new network "
            "namespace will not have",
            hint="restore into a namespace that has them (a netns path in the spec), or set "
            f"{ADD_ADDRESSES}=true to add them on lo")
    for address in foreign:
        plan["addresses"].append({"ifname": "lo", "address": address,
                                  "prefixlen": 128 if ":" in address else 32})
    netns.write_restore_plan(plan_path, plan)


def restore_files(config: dict[str, Any], bundle: str, image_path: str,
                  files: dict[str, Any]) -> None:
    torpor_dir = image_dir.state_dir(image_path)
    diff = os.path.join(torpor_dir, image_dir.ROOTFS_DIFF)
    if files.get("rootfs") and os.path.exists(diff):
        root = (config.get("root") or {}).get("path") or "rootfs"
        archive.extract(diff, os.path.join(bundle, root), mode="layer")
    sources = {str(m.get("destination", "")).rstrip("/") or "/": m.get("source")
               for m in config.get("mounts") or [] if volumes.is_bind(m)}
    saved = list(files.get("volumes") or [])
    if files.get("dev_shm"):
        saved.append(files["dev_shm"])
    for entry in saved:
        volume = volumes.Volume(**entry)
        source = sources.get(volume.destination)
        if not source:
            raise RestoreError(f"the checkpoint saved volume {volume.destination}, but the "
                               "restore-time spec has no bind mount there")
        volumes.restore(volume, torpor_dir, source)


def run(ctx: Context) -> int:
    inv = ctx.inv
    if inv.has("help", "h") or not inv.container_id:
        lowlevel.exec_runtime(ctx.runtime, inv.argv)
    container_id = inv.container_id or ""
    bundle = inv.flag("bundle", "b") or os.getcwd()
    image_path = inv.flag("image-path") or os.path.join(os.getcwd(), "checkpoint")
    config = spec.load(bundle)
    changed = modifiers.apply(config, spec_modifiers(ctx))
    state = read_state(image_path)
    if state is None:
        if changed:
            spec.flush(bundle, config)
        lowlevel.exec_runtime(ctx.runtime, inv.argv)
    assert state is not None
    from torpor.gpu import session

    session.check_before_restore(ctx.cfg, state.get("gpu"))
    record = records.record_dir(ctx.cfg.runtime_state_dir, bundle, container_id)
    plan_path = os.path.join(record, "restore-net.json")
    with contextlib.ExitStack() as undo:
        undo.callback(_unlink, plan_path)
        prepare_network(ctx, config, state, plan_path)
        restore_files(config, bundle, image_path, state.get("files") or {})
        if changed:
            spec.flush(bundle, config)
        code = runc.run(ctx.runtime, inv.with_flags(extra_flags(inv, state)))
        if code != 0:
            reason, log_path = criu_log.summary(inv.flag("work-path"), "restore.log")
            raise RestoreError(f"runc restore failed (exit {code})"
                               + (f": {reason}" if reason else ""),
                               hint=f"CRIU's log: {log_path}" if log_path else None)
        if state.get("gpu"):
            undo.callback(_kill_on_failure, ctx, container_id)
            pid = _read_pid(inv.flag("pid-file"))
            session.resume_after_restore(ctx.cfg, state["gpu"], Cgroup.of_pid(pid), ctx.log)
        undo.pop_all()
    _unlink(plan_path)
    drop_containerd_copy(image_path)
    return 0


def drop_containerd_copy(image_path: str) -> None:
    """containerd (1.6, 1.7) extracts a checkpoint it restores into a temporary directory and
    never removes it: the workload's memory, in plain files, left in /tmp. Once CRIU has
    restored from it, nobody reads it again; torpor removes it. Only that directory: one that
    containerd made (its name and place), never a checkpoint a user pointed at."""
    import shutil
    import tempfile

    path = os.path.abspath(image_path)
    parent, name = os.path.split(path)
    made_by_containerd = name.startswith(("ctrd-checkpoint", "ctd-checkpoint")) and parent in {
        os.path.abspath(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()),
        os.path.abspath(tempfile.gettempdir())}
    if made_by_containerd:
        shutil.rmtree(path, ignore_errors=True)


def _read_pid(pid_file: str | None) -> int:
    if not pid_file:
        raise RestoreError("runc restore was given no --pid-file: cannot find the restored init")
    with open(pid_file) as f:
        return int(f.read().strip())


def _kill_on_failure(ctx: Context, container_id: str) -> None:
    """Undo a CRIU restore whose GPU half failed: kill and delete the container, leaving what a
    failed `runc restore` leaves (nothing)."""
    argv = [ctx.runtime, *runc.global_args(ctx.inv), "delete", "--force", container_id]
    with contextlib.suppress(OSError):
        import subprocess

        subprocess.run(argv, capture_output=True)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

