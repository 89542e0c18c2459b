"""torpor-runc checkpoint: save what CRIU does not, around `runc checkpoint`.

The steps, in order; each undoes itself if a later one fails (an ExitStack), so a failed or
interrupted checkpoint leaves the workload running, thawed and GPU-unlocked:

 1. read the container (runc state, its spec, its cgroup) and what the caller asked: a
    `torpor checkpoint` names its journal through --work-path (torpor.capture.journal), whose
    request sends CRIU's images to its own directory and chooses the files; without one, the
    annotations, else the config; kubelet's checkpoint of a pod's container (no request) gets
    Kubernetes' defaults (capture/pod.py). One checkpoint of a container at a time;
 2. GPU: lock every CUDA process, then checkpoint each (GPU memory moves into host memory);
    undo: restore and unlock. The container must not be frozen while this runs;
 3. network: links, addresses, routes, rules, neighbours and the sockets' local addresses;
 4. freeze the container (unless containerd already paused it), so that the files saved
    match the memory CRIU dumps; undo: thaw. With --leave-running, CRIU's pre-dump action
    freezes it (torpor.shim.pre_dump), after runc's and CRIU's start-up, and steps 5 and 6
    swap: the files are saved once runc is done, the container still frozen;
 5. files: the read-write layer, bind-mounted volumes and a bind-mounted /dev/shm, per policy;
 6. `runc checkpoint` with the caller's argv: CRIU dumps the (frozen) container, within
    `[checkpoint] timeout_s` (plus 10 s per GiB of the container's memory; the clock stands
    while the post-dump hook waits for `torpor checkpoint`'s decision): past it runc and CRIU
    are killed (never the container) and the steps before are undone. For a
    `torpor checkpoint` that stops the container, CRIU's post-dump hook (torpor.shim.post_dump)
    holds the container until that `torpor` has written the whole checkpoint: commit, and CRIU
    stops it; abort (or that `torpor` dies), and CRIU lets it run on. runc's CRIU reads a
    configuration of torpor's too (CRIU_CONFIG_FILE): `skip-in-flight` ([checkpoint]
    skip_in_flight), so that a client the kernel accepted for the frozen workload fails
    nothing, and `network-lock skip` where no TCP connection is dumped ([checkpoint]
    network_lock, network_lock below);
 7. write torpor-state.json, the CRIU options in force included, so restore can put them back
    (the post-dump hook writes it in the two-phase stop, before the checkpoint is written); in
    a pod, runc's descriptors.json becomes torpor's, so only torpor-runc restores it;
 8. with --leave-running: thaw (if we froze), then GPU restore and unlock.

runc's own output, error or not, reaches the caller verbatim, after torpor's reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torpor
from torpor import ahead, durable
from torpor.capture import files, netns, pod, processes
from torpor.capture import journal as journals
from torpor.capture.freezer import Cgroup, frozen, thaw_unless_gone
from torpor.capture.journal import ContainerLock, Journal
from torpor.errors import CheckpointError, CriuError
from torpor.formats import annotations as ann
from torpor.formats import names
from torpor.formats import state as container_state
from torpor.formats.criu import CriuOptions
from torpor.formats.files import FilePolicy, SavedFiles
from torpor.formats.gpu import GpuState
from torpor.formats.journal import RuntimeRecord
from torpor.formats.network import NetworkState
from torpor.formats.oci import OciSpec
from torpor.formats.request import CheckpointRequest
from torpor.formats.state import ProcessInfo
from torpor.shim import criu_log, interrupt, post_dump, pre_dump, runc, spec, tool_answers
from torpor.shim.argv import Invocation
from torpor.shim.criu_flags import criu_options, default_flags
from torpor.shim.guardian import Guardian, Pending

if TYPE_CHECKING:
    from torpor.shim.main import Context

CONTAINERD_MARKER = "torpor-checkpoint"  # in containerd's own image directory, see _mark


def run(ctx: Context) -> int:
    inv = ctx.inv
    if inv.has("help", "h") or inv.has("pre-dump") or not inv.container_id:
        runc_exec(ctx)  # runc answers help, pre-dumps and missing arguments itself
    container_id = inv.container_id or ""
    state_dir = ctx.cfg.runtime_state_dir
    started = time.monotonic()
    timings: dict[str, float] = {}

    # 1. the checkpoint's journal, the container and the request
    journal = Journal.of_work_path(journal_roots(ctx), inv.flag("work-path"))
    if journal is not None:
        interrupt.hold(ctx, "runtime-start")  # tests: a runtime that comes late
    # held until runc is done (runc inherits it): nobody removes the journal under CRIU
    runtime_lock = journal.lock_runtime() if journal else None
    try:
        current = runc.state(ctx.runtime, inv, container_id)
    except CheckpointError:
        journals.unlock(runtime_lock)
        runc_exec(ctx)  # no such container (or runc cannot say): runc answers, in its words
        raise
    pid, bundle = current.pid, current.bundle
    lock = ContainerLock.acquire(state_dir, bundle, "runtime", container_id,
                                 f"torpor-runc pid {os.getpid()}")
    try:
        return _checkpoint(ctx, inv, journal, container_id, pid, bundle, started, timings,
                           runtime_lock)
    finally:
        lock.release()
        journals.unlock(runtime_lock)


def journal_roots(ctx: Context) -> list[str]:
    """Where `torpor checkpoint` keeps its journals (and where an older one kept them)."""
    return [journals.journals_dir(ctx.cfg.image_store),
            journals.checkpoints_dir(ctx.cfg.runtime_state_dir)]


def _checkpoint(ctx: Context, inv: Invocation, journal: Journal | None, container_id: str,
                pid: int, bundle: str, started: float, timings: dict[str, float],
                runtime_lock: int | None) -> int:
    config = spec.load(bundle)
    # 3. (the network's configuration, read on a thread of its own while the request, flags
    # and policy are read; joined before anything forks: the guardian, the GPU's worker)
    network_ahead = _capture_ahead(config, pid)
    request = journal.read_request() if journal else None
    if request is not None and request.expires and request.expires < time.time():
        raise CheckpointError(f"the request of checkpoint {journal.id if journal else '?'} "
                              "expired before the runtime was run; the container was not "
                              "touched", hint="run `torpor checkpoint` again")
    given_path = inv.flag("image-path")
    image_path = ((request.image_path if request else None) or given_path
                  or os.path.join(os.getcwd(), "checkpoint"))
    argv = inv.with_flag_value("image-path", image_path) if request and request.image_path \
        else inv.argv
    kubelet = request is None and pod.in_pod(config)
    runc_says = runc_tells_in_flight(ctx)
    argv = Invocation(argv).with_flags(default_flags(ctx.cfg, inv, config, in_pod=kubelet)
                                       + skip_in_flight_flag(ctx, inv, runc_says))
    final = Invocation(argv)
    criu = criu_options(final)
    lines = criu_lines(ctx, criu, config, final, runc_says)
    two_phase = journal is not None and not criu.leave_running
    if journal is not None and given_path and os.path.abspath(given_path) != image_path:
        _mark(given_path, journal.id)
    os.makedirs(image_path, mode=0o700, exist_ok=True)
    policy = files.choose_policy(request, config, ctx.cfg, in_pod=kubelet)
    cgroup = Cgroup.of_pid(pid)
    if journal is not None:
        journal.write_runtime_record(RuntimeRecord(
            pid=os.getpid(), init_pid=pid, cgroup=cgroup.path, cgroup_version=cgroup.version,
            froze=not cgroup.is_frozen()))

    t = time.monotonic()
    network, timings["network_s"] = network_ahead.result()
    timings["network_wait_s"] = time.monotonic() - t
    guardian = Guardian().start(lambda s: rollback(ctx, s, journal))
    with contextlib.ExitStack() as undo, interrupt.interruptible():
        undo.callback(guardian.release)
        # 2. GPU
        t = time.monotonic()
        gpu = gpu_suspend(ctx, undo, cgroup, guardian, criu.leave_running, config, pid, journal)
        timings["gpu_checkpoint_s"] = time.monotonic() - t

        # 3. network (captured above), the processes
        tree = processes.process_tree(cgroup.pids())
        # before the freeze: nothing in it may wait on torpor
        seal = seal_of(ctx, config, bundle, container_id)

        # 4. freeze, 5. files, 6. runc checkpoint; thawed as soon as runc is done
        guardian.tell(cgroup=cgroup.path, cgroup_version=cgroup.version,
                      thaw=not cgroup.is_frozen())
        if criu.leave_running and not cgroup.is_frozen():
            # frozen by CRIU's pre-dump action, as late as can be; the files once runc is done
            ran, we_froze, saved = _dump_leaving_running(
                ctx, argv, guardian, cgroup, journal, pid, config, policy, image_path, timings,
                runtime_lock, request, lines=lines)
        else:
            with frozen(cgroup, ctx.log) as we_froze:
                interrupt.hold(ctx, "frozen")
                t = time.monotonic()
                saved = files.save(pid, config, policy, image_path, ctx.log)
                timings["files_s"] = time.monotonic() - t
                env: dict[str, str] | None
                if two_phase and journal is not None:
                    journal.mark(names.PENDING_STATE, _state(
                        container_id, pid, criu, policy, network, saved, tree, gpu, timings,
                        started, we_froze, seal).dumps().decode())
                    env = post_dump.install(journal, ctx.cfg.runtime_state_dir, lines)
                else:
                    env = undo.enter_context(criu_config(ctx, lines))
                t = time.monotonic()
                with writing_back(request, image_path):
                    ran = run_runc(ctx, argv, guardian, env, journal, pid,
                                   hold_fd=runtime_lock)
                timings["runc_checkpoint_s"] = time.monotonic() - t
        guardian.tell(thaw=False)
        state = _state(container_id, pid, criu, policy, network, saved, tree, gpu, timings,
                       started, we_froze, seal)
        if ran.code != 0:
            raise _runc_failed(inv, journal, two_phase, ran)
        os.write(1, ran.output)
        os.write(2, ran.errors)

        # 7. torpor-state.json, last: its presence means torpor-runc finished
        if not two_phase:
            if kubelet:
                pod.hide_descriptors(image_path)
            container_state.write(image_path, replace(
                state, timings={**timings, "total_s": time.monotonic() - started}))
        if not criu.leave_running:
            undo.pop_all()  # the container is gone: nothing to thaw or resume
            guardian.release()
        # 8. leaving the block restores and unlocks the GPUs (leave-running)
    return 0


def writing_back(request: CheckpointRequest | None,
                 image_path: str) -> contextlib.AbstractContextManager[object]:
    """While runc and CRIU dump: where `torpor checkpoint` keeps CRIU's images as the checkpoint
    (-o DIR) and syncs them after, their writing to disk starts as CRIU writes them
    (durable.Writeback: the sync then waits ~4 ms at 64 MiB, not ~25)."""
    if request is not None and request.keep_images:
        return durable.Writeback(image_path)
    return contextlib.nullcontext()


def _capture_ahead(config: OciSpec, pid: int) -> Future[tuple[NetworkState, float]]:
    """netns.capture (pyroute2's parsing, ~15 ms) and how long it took, on a thread of its own
    from now: it overlaps the steps that wait on runc (`checkpoint --help`) and read files."""
    def capture() -> tuple[NetworkState, float]:
        t = time.monotonic()
        return netns.capture(config, pid), time.monotonic() - t

    return ahead.start(capture)


def _state(container_id: str, pid: int, criu: CriuOptions, policy: FilePolicy,
           network: NetworkState, saved: SavedFiles, tree: tuple[ProcessInfo, ...],
           gpu: GpuState | None, timings: dict[str, float], started: float, we_froze: bool,
           seal: str) -> container_state.ContainerState:
    return container_state.ContainerState(
        torpor_version=torpor.__version__, container_id=container_id, init_pid=pid, criu=criu,
        policy=policy, network=network, files=saved, processes=tree, gpu=gpu,
        timings={**timings, "total_s": time.monotonic() - started}, frozen_by_torpor=we_froze,
        spec_seal=seal)


def _dump_leaving_running(ctx: Context, argv: list[str], guardian: Guardian, cgroup: Cgroup,
                          journal: Journal | None, pid: int, config: OciSpec,
                          policy: FilePolicy, image_path: str, timings: dict[str, float],
                          runtime_lock: int | None = None,
                          request: CheckpointRequest | None = None, *,
                          lines: tuple[str, ...]) -> tuple[RuncRun, bool, SavedFiles]:
    """`runc checkpoint --leave-running` with the container frozen in CRIU's pre-dump action
    (torpor.shim.pre_dump); once runc is done and the container still frozen, its files; then
    the thaw. runc's status and output, whether the hook froze it, and the files saved."""
    hook = pre_dump.PreDumpHook.install(cgroup, journal.path if journal else None,
                                        ctx.cfg.runtime_state_dir, lines)
    we_froze = False
    saved = SavedFiles()
    try:
        t = time.monotonic()
        with writing_back(request, image_path):
            ran = run_runc(ctx, argv, guardian, hook.env(), journal, pid,
                           hold_fd=runtime_lock)
        timings["runc_checkpoint_s"] = time.monotonic() - t
        we_froze = hook.froze()
        if ran.code == 0:
            interrupt.hold(ctx, "frozen")
            t = time.monotonic()
            saved = files.save(pid, config, policy, image_path, ctx.log)
            timings["files_s"] = time.monotonic() - t
    finally:
        if hook.froze():
            thaw_unless_gone(cgroup, ctx.log)
        hook.remove()
    return ran, we_froze, saved


IN_FLIGHT_FLAG = "tcp-skip-in-flight"


def runc_tells_in_flight(ctx: Context) -> bool:
    """runc 1.3 and later tell CRIU whether to skip connections in flight themselves (false
    unless --tcp-skip-in-flight), over any configuration: does this runc take the flag?"""
    return tool_answers.takes_flag(ctx.runtime, "checkpoint", IN_FLIGHT_FLAG,
                                   ctx.cfg.runtime_state_dir)


def skip_in_flight_flag(ctx: Context, inv: Invocation, runc_says: bool) -> list[str]:
    """The flag that carries [checkpoint] skip_in_flight to a runc that tells CRIU itself
    (`runc_says`), where the caller gave none."""
    if ctx.cfg.checkpoint_skip_in_flight and runc_says and not inv.has(IN_FLIGHT_FLAG):
        return [f"--{IN_FLIGHT_FLAG}"]
    return []


def criu_lines(ctx: Context, criu: CriuOptions, config: OciSpec, inv: Invocation,
               runc_says: bool) -> tuple[str, ...]:
    """CRIU's options torpor-runc adds to runc's final argv `inv`, by the node's
    configuration."""
    lines = ["skip-in-flight"] if ctx.cfg.checkpoint_skip_in_flight else []
    lock = network_lock(ctx.cfg.checkpoint_network_lock, criu,
                        in_flight_skipped(ctx, inv, runc_says), criu_configs(config))
    if lock == "skip":
        criu_binary = tool_answers.criu_path(inv.global_flag("criu"))
        if tool_answers.criu_version(criu_binary or "criu", ctx.cfg.runtime_state_dir) \
                < SKIP_LOCK_SINCE:
            lock = None   # an older CRIU refuses the option: its own lock
    if lock:
        lines.append(f"network-lock {lock}")
    return tuple(lines)


SKIP_LOCK_SINCE = (3, 19)   # CRIU's `network-lock skip`


def in_flight_skipped(ctx: Context, inv: Invocation, runc_says: bool) -> bool:
    """Whether CRIU will leave out connections in flight for runc's final argv `inv`: a runc
    that tells CRIU itself (`runc_says`) passes --tcp-skip-in-flight, the caller's or
    torpor-runc's; older ones leave it to the `skip-in-flight` line of torpor's."""
    return inv.has(IN_FLIGHT_FLAG) if runc_says else ctx.cfg.checkpoint_skip_in_flight


def network_lock(configured: str, criu: CriuOptions, skip_in_flight: bool,
                 configs: list[str]) -> str | None:
    """The network lock CRIU is told to use ([checkpoint] network_lock), None for its own.
    CRIU's lock drops every packet in the container's namespace (iptables rules it adds and
    removes: ~50 ms of iptables-restore on the dump, and again on each restore, which uses the
    method the dump recorded) so that the TCP connections it dumps and restores in repair mode
    hold still. Without --tcp-established there are none (CRIU refuses an established
    connection), so "auto" skips it, unless:
    - in-flight connections are not skipped: then a client that connects while the container
      is frozen would fail the dump, which the lock prevents;
    - a CRIU configuration CRIU reads (`configs`) names a lock of its own, or turns
      tcp-established on behind runc's back."""
    if configured != "auto":
        return configured
    if criu.tcp_established or not skip_in_flight:
        return None
    if any(_names_option(path, ("network-lock", "tcp-established")) for path in configs):
        return None
    return "skip"


def criu_configs(config: OciSpec) -> list[str]:
    """The CRIU configuration files CRIU reads for runc's dump, besides torpor's own: the global
    and the user's defaults, the caller's CRIU_CONFIG_FILE, and runc's (the file the container's
    org.criu.config annotation names, "" for none; else /etc/criu/runc.conf)."""
    paths = ["/etc/criu/default.conf",
             os.path.join(os.environ.get("HOME", "/root"), ".criu", "default.conf")]
    if os.environ.get("CRIU_CONFIG_FILE"):
        paths.append(os.environ["CRIU_CONFIG_FILE"])
    annotations = config.get("annotations") or {}
    runc_config = annotations.get(ann.CRIU_CONFIG, "/etc/criu/runc.conf") \
        if isinstance(annotations, dict) else "/etc/criu/runc.conf"
    if isinstance(runc_config, str) and runc_config:
        paths.append(runc_config)
    return paths


MAX_CRIU_CONFIG = 1 << 20


def _names_option(path: str, options: tuple[str, ...]) -> bool:
    """Whether the CRIU configuration file at `path` sets one of `options` (CRIU's syntax: one
    option a line, `--` optional, its value after a space or `=`). Only a regular file is read,
    and at most MAX_CRIU_CONFIG of it: a container's annotation names the path, and a FIFO
    there must not hold the checkpoint up (nor /dev/zero fill torpor-runc's memory)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        lines = os.read(fd, MAX_CRIU_CONFIG).decode(errors="replace").splitlines()
    except OSError:
        return False
    finally:
        os.close(fd)
    for line in lines:
        words = line.split("#", 1)[0].split()
        if words and words[0].lstrip("-").split("=", 1)[0] in options:
            return True
    return False


@contextlib.contextmanager
def criu_config(ctx: Context, lines: tuple[str, ...]) -> Iterator[dict[str, str] | None]:
    """runc's environment naming a CRIU configuration with `lines` (criu_lines; None: runc's
    own environment), for a checkpoint without torpor's hooks; removed afterwards."""
    if not lines:
        yield None
        return
    os.makedirs(ctx.cfg.runtime_state_dir, mode=0o700, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="criu-", dir=ctx.cfg.runtime_state_dir)
    try:
        path = os.path.join(directory, "criu.conf")
        post_dump.write_action_config(path, None, lines)
        yield {**os.environ, "CRIU_CONFIG_FILE": path}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _runc_failed(inv: Invocation, journal: Journal | None, two_phase: bool,
                 ran: RuncRun) -> CriuError:
    """The error for a failed `runc checkpoint`: torpor's reason, then runc's words verbatim:
    CRIU's first errors from its log, else runc's own fatal error (a missing CRIU, a refused
    flag), which torpor's line would otherwise hide from containerd."""
    if ran.limit_s:
        log = os.path.join(inv.flag("work-path") or "", "dump.log")
        last = criu_log.last_lines(log)
        error = CriuError(
            f"runc checkpoint (CRIU) did not finish within {ran.limit_s:.0f}s; runc and CRIU "
            "were killed, the container runs on"
            + (f"; CRIU's last lines: {' | '.join(last)}" if last else ""),
            hint="[checkpoint] timeout_s sets the deadline (plus 10 s per GiB of the "
                 "container's memory)")
    elif journal is not None and two_phase and journal.marked(journals.DUMPED):
        decision = journal.decision()
        why = decision.reason if decision and decision.reason else \
            "the torpor that asked for it is gone"
        error = CriuError(f"checkpoint {journal.id} was called off after CRIU's dump ({why}); "
                          "CRIU let the container run on")
    else:
        reason, log_path = criu_log.summary(inv.flag("work-path"), "dump.log")
        reason = reason or (ran.said[-1] if ran.said else "")
        if journal is not None:  # the journal goes; containerd's shim keeps a copy (path=)
            log_path = None
        error = CriuError(f"runc checkpoint failed (exit {ran.code})"
                          + (f": {reason}" if reason else ""), log_path=log_path,
                          hint=f"CRIU's log: {log_path}" if log_path else None)
    error.runtime_output = ran.output + ran.errors
    return error


def _mark(containerd_dir: str, checkpoint_id: str) -> None:
    """containerd tars the image directory it made and stores it as content, even when CRIU's
    images went elsewhere: one small file makes that tar this checkpoint's own, so that two
    checkpoints never write the same (empty) blob at once ("content ... already exists")."""
    marker = os.path.join(containerd_dir, CONTAINERD_MARKER)
    with contextlib.suppress(OSError), open(marker, "w") as f:
        f.write(checkpoint_id + "\n")


def seal_of(ctx: Context, config: OciSpec, bundle: str, container_id: str) -> str:
    """This node's seal over the spec's requests, so that the node itself (nerdctl restoring its
    own container, ctr restoring a checkpoint taken here, Podman its own) is not refused what
    it already ran; what Podman made for the container itself is not among the requests."""
    from torpor.capture import own_engine, restore_policy

    return restore_policy.seal(restore_policy.node_key(ctx.cfg, ctx.log),
                               own_engine.requests_of(config, bundle, container_id))


@dataclass(frozen=True)
class RuncRun:
    """How `runc checkpoint` ended: its status, stdout, stderr and, when it failed, the error
    messages it wrote to the caller's --log."""

    code: int
    output: bytes
    errors: bytes
    said: tuple[str, ...] = ()
    limit_s: float = 0.0   # the deadline it overran (it was killed), else 0


def run_runc(ctx: Context, argv: list[str], guardian: Guardian,
             env: dict[str, str] | None = None, journal: Journal | None = None,
             pid: int = 0, hold_fd: int | None = None) -> RuncRun:
    """`runc checkpoint` with the caller's argv. An interrupt waits for it (CRIU must finish),
    within its deadline (torpor.deadlines), which stands still while CRIU's post-dump hook
    waits for the decision of the `torpor checkpoint` that asked (held_for_decision); past
    it runc and CRIU are killed. The output is held back: on failure, torpor's reason goes
    first, because containerd shows the first line. runc inherits `hold_fd` (the journal's
    runtime lock): the lock lives as long as runc does, even should torpor-runc and its
    guardian be killed before the guardian hears of runc."""
    from torpor.capture import deadlines

    since = ctx.log.mark()
    limit = deadlines.budget(ctx.cfg.checkpoint_timeout_s, deadlines.memory_bytes(pid)) \
        if ctx.cfg.checkpoint_timeout_s > 0 else float("inf")
    if journal is not None and limit < float("inf"):   # a GPU's memory counts in it now
        journal.publish_deadline(time.monotonic() + limit)
    if hold_fd is not None:
        os.set_inheritable(hold_fd, True)
    try:
        proc = subprocess.Popen([ctx.runtime, *argv[1:]], close_fds=False,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
    finally:
        if hold_fd is not None:
            os.set_inheritable(hold_fd, False)
    guardian.tell(runc_pid=proc.pid)
    interrupted = False
    while True:
        try:
            ended = deadlines.wait(proc, limit, lambda: held_for_decision(journal), output=True)
            break
        except interrupt.Interrupted:
            interrupted = True
    if ended is None:
        ran_inv = Invocation(argv)
        deadlines.remove_criu_yards(ran_inv.flag("work-path") or ran_inv.flag("image-path"))
        decision = journal.decision() if journal is not None else None
        if decision is not None and decision.commit:
            # CRIU hung after the commit, the checkpoint complete: the container stops, as
            # CRIU was about to stop it, and the checkpoint stands
            runc.delete_force(ctx.runtime, ran_inv, ran_inv.container_id or "")
            ctx.log.warning(f"runc checkpoint (CRIU) did not finish within {limit:.0f}s after "
                            "the checkpoint was complete: it was killed and the container "
                            "stopped")
            return RuncRun(0, b"", b"")
        return RuncRun(proc.returncode or -9, b"", b"", (), limit)
    output, errors = ended
    if interrupted:
        raise interrupt.Interrupted("interrupted during runc checkpoint")
    said = tuple(ctx.log.runc_errors(since)) if proc.returncode != 0 else ()
    return RuncRun(proc.returncode, output, errors, said)


def held_for_decision(journal: Journal | None) -> bool:
    """Whether CRIU's post-dump hook holds the dumped container for the decision of `torpor
    checkpoint` (which writes the checkpoint meanwhile, and lets go when it dies)."""
    return journal is not None and journal.marked(journals.DUMPED) and \
        journal.decision() is None


def rollback(ctx: Context, pending: Pending, journal: Journal | None) -> None:
    """In the guardian, after torpor-runc died: nothing once the checkpoint committed (CRIU
    stopped the container); else freeze again what its owner had paused and we thawed for the
    GPU driver (at once: containerd resumes it next), thaw what we froze, resume the GPUs."""
    decision = journal.decision() if journal is not None else None
    if decision is not None and decision.commit:
        return
    if pending.cgroup and pending.refreeze:
        with contextlib.suppress(OSError, CheckpointError):
            Cgroup(pending.cgroup, pending.cgroup_version).freeze()
    if pending.cgroup and pending.thaw:
        with contextlib.suppress(OSError):
            Cgroup(pending.cgroup, pending.cgroup_version).thaw()
    if pending.gpu_pids:
        from torpor.gpu import session

        session.rollback(ctx.cfg, pending.gpu_pids, ctx.log, pending.gpu_worker_pid,
                         pending.gpu_worker_deadline)


def gpu_suspend(ctx: Context, undo: contextlib.ExitStack, cgroup: Cgroup, guardian: Guardian,
                leave_running: bool, config: OciSpec, pid: int,
                journal: Journal | None = None) -> GpuState | None:
    """Lock and checkpoint the container's CUDA processes; registers their resume on `undo`.
    The guardian hears of each pid before its lock, and of each driver call in flight; the
    journal's `torpor checkpoint`, of each call's deadline."""
    from torpor.gpu import session

    def on_call(worker: int, deadline: float) -> None:
        guardian.tell(gpu_worker_pid=worker, gpu_worker_deadline=deadline)
        if journal is not None:
            journal.publish_deadline(deadline)

    return session.suspend_for_checkpoint(
        ctx.cfg, cgroup, undo, ctx.log, leave_running, config, pid,
        on_locked=lambda pids: guardian.tell(gpu_pids=pids),
        on_call=on_call,
        on_thawed=lambda thawed: guardian.tell(cgroup=cgroup.path, cgroup_version=cgroup.version,
                                               refreeze=thawed))


def runc_exec(ctx: Context) -> None:
    from torpor.shim import lowlevel

    lowlevel.exec_runtime(ctx.runtime, ctx.inv.argv)
