"""CRIU's post-dump hook: a checkpoint that stops its container stops it only once the
checkpoint is complete (the two-phase stop).

CRIU runs its action scripts after a dump and before it kills the dumped processes; when one
fails, CRIU resumes them instead (criu/cr-dump.c, cr_dump_finish: "ask user via script if we're
to break checkpoint", made for migrations that move the images first). For a checkpoint that
`torpor checkpoint` runs without --leave-running:

 1. torpor-runc writes <journal>/criu.conf (the caller's CRIU_CONFIG_FILE, if any, plus
    `action-script <journal>/post-dump`) and runs runc with CRIU_CONFIG_FILE naming it: the
    CRIU that runc starts reads it (swrk mode included);
 2. at post-dump the hook puts torpor-runc's state.json in place, makes CRIU's images
    durable (torpor.durable), marks the journal `dumped`, and waits on the decision lock,
    which `torpor checkpoint` holds while it writes the checkpoint (metadata, layers, push)
    and lets go once it has decided, or when it dies;
 3. commit: exit 0, CRIU kills the container as a plain `runc checkpoint` does (TCP sockets
    closed in repair mode, nothing sent to peers, the network lock held until then) and runc
    deletes it; abort, or no decision because `torpor` died: exit 1, CRIU resumes the
    container and unlocks its network, as if nothing had happened.

Every other action (pre-dump, network-lock, ...) exits 0 in the shell, without Python.
"""

from __future__ import annotations

import os
import shlex
import sys
import time

from torpor.atomicfile import write_atomic
from torpor.capture import journal as journals
from torpor.capture.journal import Journal
from torpor.durable import sync_tree
from torpor.formats import names
from torpor.formats import state as container_state

SCRIPT = """#!/bin/sh
# torpor: CRIU's post-dump hook for checkpoint {id} (torpor.shim.post_dump)
[ "$CRTOOLS_SCRIPT_ACTION" = post-dump ] || exit 0
exec {python} -S -c {code} {journal} {state_dir}
"""
HOOK = "post-dump"
CONFIG = "criu.conf"
RUNC_STARTED = "TORPOR_RUNC_STARTED"


def install(journal: Journal, state_dir: str, criu_lines: tuple[str, ...] = ()) -> dict[str, str]:
    """Write the hook and CRIU's configuration (with `criu_lines`) into the journal; the
    environment for runc."""
    paths = [p for p in sys.path if p]
    code = (f"import sys; sys.path[:0] = {paths!r}; "
            "from torpor.shim.post_dump import main; sys.exit(main(sys.argv))")
    script = journal.file(HOOK)
    with open(script, "w") as f:
        f.write(SCRIPT.format(id=journal.id, python=shlex.quote(sys.executable),
                              code=shlex.quote(code), journal=shlex.quote(journal.path),
                              state_dir=shlex.quote(state_dir)))
    os.chmod(script, 0o700)
    write_action_config(journal.file(CONFIG), script, criu_lines)
    return {**os.environ, "CRIU_CONFIG_FILE": journal.file(CONFIG),
            RUNC_STARTED: repr(time.time())}


def write_action_config(path: str, script: str | None, lines: tuple[str, ...] = ()) -> None:
    """A CRIU configuration file at `path`: the caller's CRIU_CONFIG_FILE, if any, then
    `action-script SCRIPT` (CRIU runs the script at each of its action points) and `lines`
    (options, as `skip-in-flight`). CRIU reads the file named by CRIU_CONFIG_FILE in swrk mode
    too, before runc's own request, which sets only the options it names."""
    inherited = ""
    if os.environ.get("CRIU_CONFIG_FILE"):
        try:
            with open(os.environ["CRIU_CONFIG_FILE"]) as f:
                inherited = f.read().rstrip("\n") + "\n"
        except OSError:
            inherited = ""
    own = ([f"action-script {script}"] if script else []) + list(lines)
    write_atomic(path, (inherited + "".join(f"{line}\n" for line in own)).encode(), mode=0o600)


def main(argv: list[str]) -> int:
    """The hook at post-dump: exit 0 to let CRIU stop the container, 1 to let it run on. Only
    a commit that `torpor checkpoint` wrote, in a journal nobody called off, stops it; every
    other way out (an error, a hold that timed out, a journal gone) lets it run on."""
    journal = Journal(argv[1])
    state_dir = argv[2] if len(argv) > 2 else os.path.dirname(os.path.dirname(journal.path))
    try:
        _finish_dump(journal)
    except Exception as e:  # the checkpoint is not whole: keep the container
        sys.stderr.write(f"torpor post-dump: {e}; the container will run on\n")
        return 1
    if not journals.hold(state_dir, "post-dump"):
        sys.stderr.write("torpor post-dump: the test hold timed out; the container will run on\n")
        return 1
    try:
        fd = journals.lock(journal.file(journals.DECISION_LOCK), wait=True)
    except OSError as e:  # the journal is gone: it was called off
        sys.stderr.write(f"torpor post-dump: {e}; the container will run on\n")
        return 1
    try:
        decision = journal.decision()
        cancelled = journal.marked(journals.CANCELLED)
    finally:
        journals.unlock(fd)
    return 0 if decision is not None and decision.commit and not cancelled else 1


def _finish_dump(journal: Journal) -> None:
    """torpor-runc's state.json into the image directory, then the `dumped` mark."""
    request = journal.read_request()
    if not request.image_path:
        raise ValueError(f"the request of checkpoint {journal.id} names no image directory")
    pending = journal.file(names.PENDING_STATE)
    with open(pending, "rb") as f:
        state = container_state.ContainerState.loads(f.read(), pending)
    started = float(os.environ.get(RUNC_STARTED) or time.time())
    timings = {**state.timings, "runc_checkpoint_s": time.time() - started}
    timings["total_s"] = timings.get("total_s", 0.0) + timings["runc_checkpoint_s"]
    # a dump marked `dumped` is on disk (it may become the only copy of the workload): CRIU's
    # images now, the state (written durably) after them
    timings["sync_dump_s"] = sync_tree(request.image_path).seconds
    from dataclasses import replace

    container_state.write(request.image_path, replace(state, timings=timings))
    journal.mark(journals.DUMPED, repr(time.time()))
