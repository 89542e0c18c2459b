"""torpor-runc checkpoint: save what CRIU does not, around `runc checkpoint`.

The steps, in order; each undoes itself if a later one fails (an ExitStack), so a failed or
interrupted checkpoint leaves the workload running, thawed and GPU-unlocked:

 1. read the container (runc state, its spec, its cgroup) and the request (`torpor
    checkpoint`'s options, left in the state dir; else the annotation, else the config); a
    request may send CRIU's images to its own directory instead of the one containerd made;
 2. GPU: lock every CUDA process, then checkpoint each (GPU memory moves into host memory);
    undo: restore and unlock. The container must not be frozen while this runs;
 3. network: links, addresses, routes, rules, neighbours and the sockets' local addresses;
 4. freeze the container (unless containerd already paused it), so that the files saved next
    match the memory CRIU dumps; undo: thaw;
 5. files: the read-write layer (overlay upperdir, as an OCI layer), bind-mounted volumes and a
    bind-mounted /dev/shm, per policy;
 6. `runc checkpoint` with the caller's argv: CRIU dumps the (frozen) container;
 7. write torpor/state.json, the CRIU flags in force included, so restore can put them back;
 8. with --leave-running: thaw (if we froze), then GPU restore and unlock.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torpor
from torpor.capture import records
from torpor.capture.freezer import Cgroup
from torpor.errors import CriuError
from torpor.shim import capture, criu_log, image_dir, interrupt, runc, spec
from torpor.shim.argv import Invocation
from torpor.shim.guardian import Guardian

if TYPE_CHECKING:
    from torpor.shim.main import Context

@contextlib.contextmanager
def frozen(cgroup: Cgroup, log: Any) -> Iterator[bool]:
    """Freeze for the block unless already frozen (containerd paused it); yields whether we did."""
    if cgroup.is_frozen():
        yield False
        return
    cgroup.freeze()
    try:
        yield True
    finally:
        if os.path.isdir(cgroup.path):  # gone after a checkpoint that stopped the container
            try:
                cgroup.thaw()
            except OSError as e:
                log.warning(f"could not thaw {cgroup.path}: {e}")


def run(ctx: Context) -> int:
    inv = ctx.inv
    if inv.has("help", "h") or inv.has("pre-dump") or not inv.container_id:
        runc_exec(ctx)  # runc answers help, pre-dumps and missing arguments itself
    container_id = inv.container_id or ""
    started = time.monotonic()
    timings: dict[str, float] = {}
    current = runc.state(ctx.runtime, inv, container_id)
    pid, bundle = int(current["pid"]), current["bundle"]
    config = spec.load(bundle)
    request = records.take_request(records.record_dir(ctx.cfg.runtime_state_dir, bundle,
                                                      container_id))
    image_path = (request.get("image_path") or inv.flag("image-path")
                  or os.path.join(os.getcwd(), "checkpoint"))
    argv = inv.with_flag_value("image-path", image_path) if request.get("image_path") else inv.argv
    defaults = capture.default_flags(ctx, inv, config)
    if defaults:
        argv = Invocation(argv).with_flags(defaults)
    os.makedirs(image_path, mode=0o700, exist_ok=True)
    out_dir = image_dir.ensure(image_path)
    chosen = capture.policy(ctx, request, config)
    cgroup = Cgroup.of_pid(pid)
    flags = capture.criu_flags(Invocation(argv))
    state: dict[str, Any] = {
        "format": image_dir.FORMAT,
        "torpor_version": torpor.__version__,
        "container_id": container_id,
        "init_pid": pid,
        "criu_flags": flags,
        "policy": chosen,
    }
    guardian = Guardian().start(lambda s: rollback(ctx, s))
    with contextlib.ExitStack() as undo, interrupt.interruptible():
        undo.callback(guardian.release)
        t = time.monotonic()
        state["gpu"] = gpu_suspend(ctx, undo, cgroup, guardian, flags["leave-running"])
        timings["gpu_checkpoint_s"] = time.monotonic() - t

        t = time.monotonic()
        state["network"] = capture.network_state(config, pid)
        state["mounts"] = config.get("mounts", [])
        state["processes"] = capture.process_tree(cgroup.pids())
        timings["network_s"] = time.monotonic() - t

        guardian.tell(cgroup=cgroup.path, cgroup_version=cgroup.version,
                      thaw=not cgroup.is_frozen())
        with frozen(cgroup, ctx.log) as we_froze:  # thawed as soon as runc is done
            interrupt.hold(ctx, "frozen")
            t = time.monotonic()
            state["files"] = capture.save_files(ctx, pid, config, chosen, out_dir)
            timings["files_s"] = time.monotonic() - t
            t = time.monotonic()
            code, output = run_runc(ctx, argv, guardian)
            timings["runc_checkpoint_s"] = time.monotonic() - t
        guardian.tell(thaw=False)
        if code != 0:
            reason, log_path = criu_log.summary(inv.flag("work-path"), "dump.log")
            error = CriuError(f"runc checkpoint failed (exit {code})"
                              + (f": {reason}" if reason else ""), log_path=log_path,
                              hint=f"CRIU's log: {log_path}" if log_path else None)
            error.runtime_output = output
            raise error
        os.write(1, output)

        state["timings"] = {**timings, "total_s": time.monotonic() - started}
        state["frozen_by_torpor"] = we_froze
        image_dir.write_json(os.path.join(out_dir, image_dir.STATE), state)
        if not flags["leave-running"]:
            undo.pop_all()  # the container is gone: nothing to thaw or resume
            guardian.release()
        # leaving the block restores and unlocks the GPUs (leave-running)
    return 0


def run_runc(ctx: Context, argv: list[str], guardian: Guardian) -> tuple[int, bytes]:
    """`runc checkpoint` with the caller's argv; its exit status and output. An interrupt waits
    for it (CRIU must finish). The output is held back: on failure, torpor's reason goes first,
    because containerd shows the first line."""
    proc = subprocess.Popen([ctx.runtime, *argv[1:]], close_fds=False, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    guardian.tell(runc_pid=proc.pid)
    interrupted = False
    output = b""
    while True:
        try:
            output, _ = proc.communicate()
            break
        except interrupt.Interrupted:
            interrupted = True
    if interrupted:
        raise interrupt.Interrupted("interrupted during runc checkpoint")
    return proc.returncode, output


def rollback(ctx: Context, state: dict[str, Any]) -> None:
    """In the guardian, after torpor-runc died: thaw what we froze, resume the GPUs."""
    if state.get("cgroup") and state.get("thaw"):
        with contextlib.suppress(OSError):
            Cgroup(state["cgroup"], int(state["cgroup_version"])).thaw()
    if state.get("gpu_pids"):
        from torpor.gpu import session

        session.rollback(ctx.cfg, state["gpu_pids"], ctx.log)


def gpu_suspend(ctx: Context, undo: contextlib.ExitStack, cgroup: Cgroup, guardian: Guardian,
                leave_running: bool) -> dict[str, Any] | None:
    """Lock and checkpoint the container's CUDA processes; registers their resume on `undo`."""
    from torpor.gpu import session

    return session.suspend_for_checkpoint(ctx.cfg, cgroup, undo, ctx.log, leave_running,
                                          on_locked=lambda pids: guardian.tell(gpu_pids=pids))


def runc_exec(ctx: Context) -> None:
    from torpor.shim import lowlevel

    lowlevel.exec_runtime(ctx.runtime, ctx.inv.argv)

