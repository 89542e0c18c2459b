"""torpor-runc checkpoint: save what CRIU does not, around `runc checkpoint`.

The steps, in order; each undoes itself if a later one fails (an ExitStack), so a failed or
interrupted checkpoint leaves the workload running, thawed and GPU-unlocked:

 1. read the container (runc state, its spec, its cgroup) and the request `torpor checkpoint`
    left in the state dir (else the annotations, else the config); a request may send CRIU's
    images to its own directory instead of the one containerd made; kubelet's checkpoint of a
    pod's container (no request) gets Kubernetes' defaults (capture/pod.py);
 2. GPU: lock every CUDA process, then checkpoint each (GPU memory moves into host memory);
    undo: restore and unlock. The container must not be frozen while this runs;
 3. network: links, addresses, routes, rules, neighbours and the sockets' local addresses;
 4. freeze the container (unless containerd already paused it), so that the files saved next
    match the memory CRIU dumps; undo: thaw;
 5. files: the read-write layer, bind-mounted volumes and a bind-mounted /dev/shm, per policy;
 6. `runc checkpoint` with the caller's argv: CRIU dumps the (frozen) container;
 7. write torpor-state.json, the CRIU options in force included, so restore can put them back;
    in a pod, runc's descriptors.json becomes torpor's, so only torpor-runc restores it;
 8. with --leave-running: thaw (if we froze), then GPU restore and unlock.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from typing import TYPE_CHECKING

import torpor
from torpor.capture import files, netns, pod, processes, records
from torpor.capture.freezer import Cgroup, frozen
from torpor.errors import CriuError
from torpor.formats import state as container_state
from torpor.formats.gpu import GpuState
from torpor.formats.oci import OciSpec
from torpor.shim import criu_log, interrupt, runc, spec
from torpor.shim.argv import Invocation
from torpor.shim.criu_flags import criu_options, default_flags
from torpor.shim.guardian import Guardian, Pending

if TYPE_CHECKING:
    from torpor.shim.main import Context


def run(ctx: Context) -> int:
    inv = ctx.inv
    if inv.has("help", "h") or inv.has("pre-dump") or not inv.container_id:
        runc_exec(ctx)  # runc answers help, pre-dumps and missing arguments itself
    container_id = inv.container_id or ""
    started = time.monotonic()
    timings: dict[str, float] = {}

    # 1. the container and the request
    current = runc.state(ctx.runtime, inv, container_id)
    pid, bundle = current.pid, current.bundle
    config = spec.load(bundle)
    request = records.take_request(records.record_dir(ctx.cfg.runtime_state_dir, bundle,
                                                      container_id))
    image_path = ((request.image_path if request else None) or inv.flag("image-path")
                  or os.path.join(os.getcwd(), "checkpoint"))
    argv = inv.with_flag_value("image-path", image_path) if request and request.image_path \
        else inv.argv
    kubelet = request is None and pod.in_pod(config)
    argv = Invocation(argv).with_flags(default_flags(ctx.cfg, inv, config, in_pod=kubelet))
    criu = criu_options(Invocation(argv))
    os.makedirs(image_path, mode=0o700, exist_ok=True)
    policy = files.choose_policy(request, config, ctx.cfg, in_pod=kubelet)
    cgroup = Cgroup.of_pid(pid)

    guardian = Guardian().start(lambda s: rollback(ctx, s))
    with contextlib.ExitStack() as undo, interrupt.interruptible():
        undo.callback(guardian.release)
        # 2. GPU
        t = time.monotonic()
        gpu = gpu_suspend(ctx, undo, cgroup, guardian, criu.leave_running)
        timings["gpu_checkpoint_s"] = time.monotonic() - t

        # 3. network
        t = time.monotonic()
        network = netns.capture(config, pid)
        tree = processes.process_tree(cgroup.pids())
        timings["network_s"] = time.monotonic() - t

        # 4. freeze, 5. files, 6. runc checkpoint; thawed as soon as runc is done
        guardian.tell(cgroup=cgroup.path, cgroup_version=cgroup.version,
                      thaw=not cgroup.is_frozen())
        with frozen(cgroup, ctx.log) as we_froze:
            interrupt.hold(ctx, "frozen")
            t = time.monotonic()
            saved = files.save(pid, config, policy, image_path, ctx.log)
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

        # 7. torpor-state.json, last: its presence means torpor-runc finished
        if kubelet:
            pod.hide_descriptors(image_path)
        container_state.write(image_path, container_state.ContainerState(
            torpor_version=torpor.__version__, container_id=container_id, init_pid=pid,
            criu=criu, policy=policy, network=network, files=saved, processes=tree, gpu=gpu,
            timings={**timings, "total_s": time.monotonic() - started},
            frozen_by_torpor=we_froze, spec_seal=seal_of(ctx, config)))
        if not criu.leave_running:
            undo.pop_all()  # the container is gone: nothing to thaw or resume
            guardian.release()
        # 8. leaving the block restores and unlocks the GPUs (leave-running)
    return 0


def seal_of(ctx: Context, config: OciSpec) -> str:
    """This node's seal over the spec's requests, so that the node itself (nerdctl restoring its
    own container, ctr restoring a checkpoint taken here) is not refused what it already ran."""
    from torpor.capture import restore_policy
    from torpor.formats.spec_requests import SpecRequests

    return restore_policy.seal(restore_policy.node_key(ctx.cfg), SpecRequests.of(config))


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


def rollback(ctx: Context, pending: Pending) -> None:
    """In the guardian, after torpor-runc died: thaw what we froze, resume the GPUs."""
    if pending.cgroup and pending.thaw:
        with contextlib.suppress(OSError):
            Cgroup(pending.cgroup, pending.cgroup_version).thaw()
    if pending.gpu_pids:
        from torpor.gpu import session

        session.rollback(ctx.cfg, pending.gpu_pids, ctx.log)


def gpu_suspend(ctx: Context, undo: contextlib.ExitStack, cgroup: Cgroup, guardian: Guardian,
                leave_running: bool) -> GpuState | None:
    """Lock and checkpoint the container's CUDA processes; registers their resume on `undo`."""
    from torpor.gpu import session

    return session.suspend_for_checkpoint(ctx.cfg, cgroup, undo, ctx.log, leave_running,
                                          on_locked=lambda pids: guardian.tell(gpu_pids=pids))


def runc_exec(ctx: Context) -> None:
    from torpor.shim import lowlevel

    lowlevel.exec_runtime(ctx.runtime, ctx.inv.argv)
