"""torpor-runc create of a container whose image is a checkpoint: it restores, where the node's
`[restore] on_create` allows it; any other create goes to runc untouched.

main.py sends a `create` here only where on_create is on and the bundle's config.json names the
runnable image's mark (on_create_check.py). Steps, in order:
 1. the spec: the mark in process.env, and no `io.torpor.restore.cold-start: "true"`
    annotation; else runc creates the container cold, as ever;
 2. the checkpoint (ops/on_create.py): the container's image in containerd, its signature and
    metadata from the registry, this node against it, its state unpacked into a directory of its
    own under `<state_dir>/on-create/`;
 3. torpor-runc restore (restore_cmd.py: the restore policy on the spec, CRIU's images against
    it, network, files, GPU, `runc restore` within its deadline) with create's bundle, pid
    file and console socket, detached: the restored init is the shim's, as a created one is;
 4. a mark in runc's state directory of the container, so that the shim's `start` has nothing to
    do (start_cmd.py); runc removes it with the container.
A failure at any step leaves nothing: the unpacked checkpoint goes, runc removes what it made,
and the error (torpor's words, runc's and CRIU's) goes to runc's log, where the shim reads it;
CRIU's restore log is kept in `[runtime] log_dir`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from typing import TYPE_CHECKING

from torpor import held_dirs
from torpor.atomicfile import write_atomic
from torpor.errors import TorporError
from torpor.formats import annotations as ann
from torpor.formats import names
from torpor.formats.oci import OciSpec
from torpor.shim import lowlevel, runc, spec
from torpor.shim.argv import Invocation

if TYPE_CHECKING:
    from torpor.shim.main import Context


def wants_restore(config: OciSpec) -> bool:
    """Step 1: a checkpoint's runnable image, and not asked to start cold."""
    env = (config.get("process") or {}).get("env") or []
    marked = any(isinstance(e, str) and e.startswith(names.CHECKPOINT_ENV + "=") for e in env)
    cold = str((config.get("annotations") or {}).get(ann.RESTORE_COLD_START, "")).lower()
    return marked and cold != "true"


def restore_argv(inv: Invocation, bundle: str, image_path: str, work_path: str) -> list[str]:
    """`runc restore` for what the shim asked `runc create` to do."""
    argv = [inv.argv[0], *runc.global_args(inv), "restore", "--image-path", image_path,
            "--work-path", work_path, "--detach", "--no-subreaper"]
    pid_file = inv.flag("pid-file")
    if pid_file:
        argv += ["--pid-file", pid_file]
    console = inv.flag("console-socket")
    if console:
        argv += ["--console-socket", console]
    if inv.has("no-pivot"):
        argv.append("--no-pivot")
    return [*argv, "--bundle", bundle, inv.container_id or ""]


def run(ctx: Context) -> int:
    inv = ctx.inv
    bundle = os.path.abspath(inv.flag("bundle", "b") or os.getcwd())
    container_id = inv.container_id
    if inv.has("help", "h") or not container_id or not wants_restore(spec.load(bundle)):
        lowlevel.exec_runtime(ctx.runtime, inv.argv)
    assert container_id is not None
    from torpor.ops import on_create
    from torpor.shim import restore_cmd
    from torpor.shim.main import Context as ShimContext

    # containerd 2.x says; 1.6 and 1.7 put bundles at .../<namespace>/<id>
    namespace = os.environ.get("NAMESPACE") or os.path.basename(os.path.dirname(bundle))
    from torpor.capture.restore_policy import ON_CREATE_DIR

    names.check_identifier(container_id, "the container id")
    names.check_identifier(namespace, "the containerd namespace")
    root = os.path.join(ctx.cfg.runtime_state_dir, ON_CREATE_DIR)
    sweep(root)
    name = f"{namespace}-{container_id}-{secrets.token_hex(8)}"
    held = held_dirs.make(root, name)   # this create's: sweep leaves it while it lives
    work = os.path.join(root, name)
    try:
        source = on_create.source_of(on_create.containerd_address(os.environ), namespace,
                                     container_id)
        directory = os.path.join(work, "checkpoint")
        _, signature = on_create.fetch_checkpoint(ctx.cfg, source, directory, ctx.runtime)
        ctx.log.info(f"restoring {container_id} at create from {source.pinned}: "
                     f"{signature.describe()}")
        argv = restore_argv(inv, bundle, os.path.join(directory, names.CRIU_DIR),
                            os.path.join(work, "criu-work"))
        try:
            code = restore_cmd.run(ShimContext(Invocation(argv), ctx.runtime, ctx.cfg))
        except TorporError as e:
            kept = keep_restore_log(ctx, namespace, container_id, work)
            if kept:
                e.hint = f"CRIU's log: {kept}"
            raise
        finally:   # a CRIU killed mid-restore leaves its cgroup yards mounted there
            from torpor.capture import deadlines

            deadlines.remove_criu_yards(os.path.join(work, "criu-work"))
        if code != 0:
            return code
        try:
            mark(inv, container_id)
        except OSError:   # a restored container create cannot report is no container at all
            runc.delete_force(ctx.runtime, inv, container_id)
            raise
        record(ctx.cfg.runtime_state_dir, namespace, container_id, source.pinned)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(held)


def sweep(root: str) -> None:
    """Remove what creates killed mid-restore left under `root` (the shim SIGKILLs torpor-runc
    when containerd's call times out): their unpacked checkpoints, the workload's memory."""
    try:
        entries = os.listdir(root)
    except FileNotFoundError:
        return
    for name in entries:
        path = os.path.join(root, name)
        if name.startswith(".") or not held_dirs.abandoned(path):
            continue   # being made, or a create under way
        from torpor.capture import deadlines

        deadlines.remove_criu_yards(os.path.join(path, "criu-work"))
        shutil.rmtree(path, ignore_errors=True)


def mark(inv: Invocation, container_id: str) -> None:
    """Step 4: the mark start_cmd looks for."""
    from torpor.shim.on_create_check import RUNC_ROOT

    state = os.path.join(inv.global_flag("root") or RUNC_ROOT, container_id)
    with open(os.path.join(state, names.RESTORED_ON_CREATE), "x"):
        pass


RECORD_KEEP_S = 86400


def record(state_dir: str, namespace: str, container_id: str, restored_from: str) -> None:
    """That this container was restored, not started cold, for whoever must know it before it
    lets the original go (torpor kube migrate, through `torpor kube restored`). Without it, a
    restored container only counts as not restored: that errs on the safe side."""
    directory = os.path.join(state_dir, names.RESTORED_RECORDS)
    with contextlib.suppress(OSError):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        write_atomic(os.path.join(directory, f"{namespace}-{container_id}"),
                     (restored_from + "\n").encode(), mode=0o600)
    # a record is read within minutes of its restore: a day's are kept, older ones go
    old = time.time() - RECORD_KEEP_S
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat().st_mtime < old:
                    os.unlink(entry.path)


def keep_restore_log(ctx: Context, namespace: str, container_id: str, work: str) -> str | None:
    """CRIU's restore log past the clean-up of the work directory: where the real reason is."""
    log = os.path.join(work, "criu-work", "restore.log")
    if not os.path.exists(log):
        return None
    os.makedirs(ctx.cfg.runtime_log_dir, mode=0o700, exist_ok=True)
    kept = os.path.join(ctx.cfg.runtime_log_dir,
                        f"{namespace}-{container_id}.restore-on-create-failed.log")
    shutil.copyfile(log, kept)
    return kept
