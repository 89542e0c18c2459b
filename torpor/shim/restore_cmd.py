"""torpor-runc restore: put back what CRIU does not restore, around `runc restore`.

The steps, in order:

 1. check the restore-time spec against this node's restore policy (capture.restore_policy):
    exactly what `torpor restore` granted (its record), requests this node sealed at checkpoint
    time, a spec the engine made for this container (kubelet's in a CRI restore, any engine's
    in a restore on create: create_cmd.py), or else what the policy allows alone; what
    Podman made for the container itself (its root, its files, a fresh network namespace:
    capture.own_engine) is not a request;
    then write torpor's hooks into it, this node's own (createRuntime and poststop);
 2. read torpor-state.json from the image directory (none: a plain runc checkpoint, handed over);
 3. put back the CRIU flags containerd does not repeat on restore (tcp-established,
    file-locks, ext-unix-sk, shell-job), as they were at checkpoint time;
 4. GPU: refuse early when this node cannot take the GPU state (free memory, model, driver);
 5. network: into a namespace runc creates, leave a plan for torpor-hook, which runc runs at
    CRIU's setup-namespaces step (lo up, recorded addresses and routes, before sockets are
    bound again); into an existing namespace (a path), check that the addresses the sockets
    need are there, or add them when the annotation io.torpor.restore.add-addresses is "true";
    in a Kubernetes pod, connections the pod's new address cannot carry are restored closed,
    and a checkpoint kubelet took gets runc's descriptors.json back (capture/pod.py);
 6. files: the read-write layer (when it travelled in the image directory, as with ctr),
    volumes and /dev/shm, into the restore-time rootfs and bind sources, never following a
    symlink out of them and within the limits of `[restore]`; then CRIU's images against the
    spec, the policy and that rootfs (torpor.criu_images), a plain runc checkpoint's too;
 7. `runc restore` with the caller's argv plus the flags of step 3 (and `--lazy-pages` when
    `torpor restore --lazy` left its page source's socket in the work directory), within `[restore]
    timeout_s` (plus 10 s per GiB of CRIU images) when detached: past it runc, its CRIU and
    the half-restored container are killed and deleted, and the error says where CRIU stood;
 8. GPU: restore each CUDA process (GPU UUID pairs when this node's GPUs differ), then unlock,
    while CRIU has left every task stopped (`leave-stopped` through the CRIU configuration
    runc hands it, step 4), then let them go on. If that fails, the restored container is
    killed: a restore succeeds whole or not at all.

The checkpoint is only read, never changed.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from torpor.capture import files, netns, own_engine, pod, records, restore_policy
from torpor.capture.freezer import Cgroup
from torpor.errors import DeadlineExceeded, FormatError, RestoreError
from torpor.formats import annotations as ann
from torpor.formats import names
from torpor.formats import state as container_state
from torpor.formats.oci import OciSpec
from torpor.formats.spec_requests import SpecRequests
from torpor.formats.state import ContainerState
from torpor.shim import criu_log, lowlevel, modifiers, runc, served, spec

if TYPE_CHECKING:
    from torpor.shim.main import Context


def read_state(image_path: str) -> ContainerState | None:
    try:
        return container_state.read(image_path)
    except FormatError as e:
        raise RestoreError(str(e)) from None


def prepare_network(spec_doc: OciSpec, state: ContainerState, plan_path: str,
                    criu_config: str) -> bool:
    """Check or plan the addresses the sockets need; True when connections are to be closed
    (a CRIU config with tcp-close is then at `criu_config`)."""
    if netns.shares_host_network(spec_doc):
        return False   # the host's own network: nothing of it is torpor's to set up or change
    network = state.network
    sockets = network.sockets
    add = (spec_doc.get("annotations") or {}).get(ann.RESTORE_ADD_ADDRESSES, "").lower() == "true"
    path = netns.spec_netns_path(spec_doc)
    close = False
    if pod.in_pod(spec_doc) and not add:
        present = netns.present_addresses(path) if path else set()
        close = bool(pod.lost_connections(sockets, present))
        if close:
            pod.write_tcp_close_config(criu_config)
            closed = set(pod.connections(sockets))
            sockets = tuple(s for s in sockets if s not in closed)
    needed = netns.needed_addresses(sockets)
    if path:
        if not os.path.exists(path):
            raise RestoreError(f"the network namespace {path} in the spec does not exist")
        missing = netns.missing_addresses(path, needed)
        if missing and not add:
            raise RestoreError(
                f"the network namespace {path} lacks the addresses the checkpointed sockets are "
                f"bound to: {', '.join(missing)}",
                hint=f"give the namespace these addresses, or set the annotation "
                f"{ann.RESTORE_ADD_ADDRESSES}=true (torpor restore --add-addresses) to add them")
        if missing:
            netns.add_addresses(path, missing, network.config)
        return close
    plan = netns.restore_plan(network.config)
    on_lo = {a.address for a in plan.addresses}
    foreign = [a for a in needed if a not in on_lo]
    # other hooks where the namespace is set up (nerdctl's CNI hook) may give it the addresses;
    # if they do not, CRIU says which one it could not bind
    if foreign and not add and not others_set_up_namespaces(spec_doc):
        raise RestoreError(
            f"the checkpointed sockets are bound to {', '.join(foreign)}, which a new network "
            "namespace will not have",
            hint="restore into a namespace that has them (a netns path in the spec), or set "
            f"{ann.RESTORE_ADD_ADDRESSES}=true to add them on lo")
    netns.write_restore_plan(plan_path, netns.restore_plan(network.config,
                                                           extra=foreign if add else ()))
    return close


def others_set_up_namespaces(spec_doc: OciSpec) -> bool:
    """Whether the spec has hooks besides torpor's where runc sets up namespaces."""
    hooks = spec_doc.get("hooks") or {}
    return any((hook.get("args") or [None])[0] != modifiers.HOOK_MARKER
               for stage in ("prestart", "createRuntime") for hook in hooks.get(stage) or [])


def run(ctx: Context) -> int:
    inv = ctx.inv
    if inv.has("help", "h") or not inv.container_id:
        lowlevel.exec_runtime(ctx.runtime, inv.argv)
    container_id = inv.container_id or ""
    bundle = inv.flag("bundle", "b") or os.getcwd()
    image_path = inv.flag("image-path") or os.path.join(os.getcwd(), "checkpoint")

    # 1. the policy, then hooks, 2. torpor's state
    config = spec.load(bundle)
    state = read_state(image_path)
    record = records.record_dir(ctx.cfg.runtime_state_dir, bundle, container_id)
    # what Podman made for the container itself (its root, its files) is not the checkpoint's
    requests = own_engine.requests_of(config, bundle, container_id, restoring=True)
    engine_made = restore_policy.built_by_cri(image_path, container_id) or \
        restore_policy.built_for_create(image_path, ctx.cfg.runtime_state_dir)
    sealed = engine_made or (
        state is not None and bool(state.spec_seal) and any(
            restore_policy.sealed_here(restore_policy.node_key(ctx.cfg, ctx.log),
                                       sealed_requests, state.spec_seal)
            for sealed_requests in {requests, SpecRequests.of(config)}))  # and older seals
    work = granting_work_dir(ctx)
    policy = restore_policy.RestorePolicy.of(ctx.cfg)
    if engine_made:
        restore_policy.check_engine_made(requests, policy)
    own = restore_policy.check_in_runtime(requests, policy,
                                          restore_policy.take_grant(work) if work else None,
                                          sealed_here=sealed)
    dropped = [] if own else restore_policy.admit_annotations(config, policy)
    if dropped:
        ctx.log.info(f"dropped annotations [restore] annotations does not name: "
                     f"{', '.join(dropped)}")
    changed = modifiers.apply(config, modifiers.torpor_hooks(ctx.hook_path(),
                                                             ctx.cfg.runtime_state_dir))
    changed = changed or bool(dropped)
    if state is None:
        check_images(ctx, image_path, config, bundle)
        if changed:
            spec.flush(bundle, config)
        return _runc_restore(ctx, inv.argv, image_path, plain=True)  # runc's own checkpoint
    assert state is not None
    from torpor.gpu import restore as gpu_restore

    # 4. GPU: refuse early; CRIU is to leave the restored tasks stopped until step 8
    gpu_plan = gpu_restore.check_before_restore(ctx.cfg, state.gpu, config)
    plan_path = os.path.join(record, names.RESTORE_PLAN)
    criu_config = os.path.join(record, names.CRIU_RESTORE_CONFIG)
    with contextlib.ExitStack() as undo:
        undo.callback(records.remove_record, record)  # nothing of a failed restore stays
        # 5. network, 6. files
        if prepare_network(config, state, plan_path, criu_config):
            changed = _use_criu_config(ctx, config, criu_config) or changed
        if gpu_plan is not None:  # one CRIU config file: the network's lines, then the GPU's
            from torpor.gpu import criu_config as gpu_criu_config

            gpu_criu_config.hold_stopped(config, criu_config)
            changed = True
        pod.reveal_descriptors(image_path)
        files.restore(config, bundle, image_path, state.files,
                      restore_policy.archive_limits(ctx.cfg), ctx.cfg.restore_allow_device_files,
                      engine_made=engine_made, mount_sources=policy.mount_sources)
        check_images(ctx, image_path, config, bundle)
        if changed:
            spec.flush(bundle, config)
        # 3. + 7. runc restore with the flags containerd dropped
        extra = [flag for flag in state.criu.restore_flags() if not inv.has(flag[2:])]
        lazy = lazy_pages_waiting(work)
        if lazy and not inv.has("lazy-pages"):
            extra.append("--lazy-pages")   # torpor restore --lazy started the page source
        since = ctx.log.mark()
        code = _runc_restore(ctx, inv.with_flags(extra), image_path)
        if code != 0:
            reason, log_path = criu_log.summary(inv.flag("work-path"), "restore.log")
            said = ctx.log.runc_errors(since)  # runc's own fatal error, when CRIU said nothing
            reason = reason or (said[-1] if said else "")
            raise RestoreError(f"runc restore failed (exit {code})"
                               + (f": {reason}" if reason else ""),
                               hint=f"CRIU's log: {log_path}" if log_path else None)
        # 8. GPU restore and unlock; a failure removes the restored container
        if state.gpu is not None and gpu_plan is not None:
            undo.callback(_kill_on_failure, ctx, container_id)
            pid = _read_pid(inv.flag("pid-file"))
            gpu_restore.restore_gpus(ctx.cfg, state.gpu, gpu_plan, Cgroup.of_pid(pid), ctx.log,
                                     lazy)
        undo.pop_all()
    records.remove_record(record)  # torpor-hook has applied the plan: nothing else lives here
    drop_containerd_copy(image_path)
    return 0


def check_images(ctx: Context, image_path: str, config: OciSpec, bundle: str) -> None:
    """CRIU's images against the spec runc restores with, the container's rootfs mounted."""
    from torpor import criu_images

    root = str((config.get("root") or {}).get("path") or "rootfs")
    criu_images.check(image_path, config, ctx.cfg, root=os.path.join(bundle, root))


def _runc_restore(ctx: Context, argv: list[str], image_path: str, plain: bool = False) -> int:
    """`runc restore` (step 7, or all of a `plain` runc checkpoint's restore), with its
    deadline when detached: runc then returns once CRIU is done (in the foreground it lives as
    long as the container, and has none: a plain one is then exec'd, as before). In torpord's
    child, the front end that handed the restore over runs runc, below the shim (served.py)."""
    from torpor.capture import deadlines

    inv = ctx.inv
    limit = deadlines.budget(ctx.cfg.restore_timeout_s, deadlines.tree_bytes(image_path)) \
        if inv.has("detach", "d") and ctx.cfg.restore_timeout_s > 0 else None
    if served.active():
        try:
            code = served.run([ctx.runtime, *argv[1:]], limit)
        except served.FrontEndGone:
            _remove_half_restored(ctx, image_path)
            raise
    elif limit is None:
        if plain:
            lowlevel.exec_runtime(ctx.runtime, argv)
        return runc.run(ctx.runtime, argv)
    else:
        code = runc.run_within(ctx.runtime, argv, limit)
    if code is not None:
        if code < 0:   # runc killed (a signal its caller forwarded): nothing of it stays
            _remove_half_restored(ctx, image_path)
        return code
    assert limit is not None
    _remove_half_restored(ctx, image_path)
    log = os.path.join(inv.flag("work-path") or image_path, "restore.log")
    last = criu_log.last_lines(log)
    raise DeadlineExceeded(
        f"runc restore (CRIU) did not finish within {limit:.0f}s; runc, CRIU and the "
        "half-restored container were killed and removed"
        + (f"; CRIU's last lines: {' | '.join(last)}" if last else ""),
        hint=f"CRIU's log: {log}; [restore] timeout_s sets the deadline (plus "
        f"{deadlines.PER_GIB_S:.0f} s per GiB of CRIU images)")


def _remove_half_restored(ctx: Context, image_path: str) -> None:
    """What a killed `runc restore` left: the container runc made (its processes, cgroup and
    state) and CRIU's cgroup yards."""
    from torpor.capture import deadlines

    inv = ctx.inv
    runc.delete_force(ctx.runtime, inv, inv.container_id or "")
    deadlines.remove_criu_yards(inv.flag("work-path") or image_path)


def granting_work_dir(ctx: Context) -> str | None:
    """Where `torpor restore` left its grant: the work directory it made for this one restore
    (`<state_dir>/restore-work/...`), which containerd passes on as --work-path; never a
    directory shared by two restores or two containerd instances."""
    work = ctx.inv.flag("work-path")
    root = os.path.abspath(os.path.join(ctx.cfg.runtime_state_dir, "restore-work"))
    if work and os.path.dirname(os.path.abspath(work)) == root:
        return work
    return None


def lazy_pages_waiting(work: str | None) -> bool:
    """`torpor restore --lazy` made this restore's work directory and started `criu lazy-pages`
    there (torpor.lazy): runc restore is then to leave the lazy pages to it."""
    return work is not None and os.path.exists(os.path.join(work, names.LAZY_PAGES_SOCKET))


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


def _use_criu_config(ctx: Context, config: OciSpec, path: str) -> bool:
    """Point runc's annotation org.criu.config at `path` (tcp-close), unless the container
    names its own CRIU config, which then decides."""
    annotations = config.setdefault("annotations", {})
    if annotations.get(ann.CRIU_CONFIG):
        ctx.log.warning(f"the container sets {ann.CRIU_CONFIG}: its connections are restored as "
                     "that file says, not closed")
        return False
    ctx.log.info("restoring established TCP connections closed: the pod's address changed")
    annotations[ann.CRIU_CONFIG] = path
    return True


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
