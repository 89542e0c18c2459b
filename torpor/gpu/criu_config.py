"""The CRIU configuration of a GPU restore: CRIU leaves every restored task stopped.

CRIU lets the restored tasks run as soon as it has restored them; the driver's half of the
restore comes after. So that no task runs before its GPU state is back, torpor has CRIU stop
them all first: `leave-stopped` makes CRIU send SIGSTOP to every task before it detaches from
them (finalize_restore in criu/cr-restore.c; `criu restore --leave-stopped`). runc has no flag
for it (runc 1.1 to 1.3), but it hands CRIU one configuration file, whose options override
runc's own (CRIU reads it after the RPC options, criu/cr-service.c): the file the spec
annotation org.criu.config names, else /etc/criu/runc.conf (runc's
handleCriuConfigurationFile, libcontainer). For a checkpoint that holds GPU state torpor-runc
writes a file of its own, the lines of the file runc would have used followed by
`leave-stopped`, and points the annotation of the restore-time spec at it.

Why not a moment inside CRIU instead: CRIU's last hooks before the tasks run (a pre-resume
action script, which runc's CRIU configuration could name too) run while CRIU holds every
thread under ptrace, so the driver's restore thread could not run for an outside caller;
only CRIU's own cuda plugin can let it run there, and torpor must keep that plugin out
(criu_plugin.py).
"""

from __future__ import annotations

import os

from torpor.atomicfile import write_atomic
from torpor.formats.oci import OciSpec

ANNOTATION = "org.criu.config"
RUNC_DEFAULT = "/etc/criu/runc.conf"
LEAVE_STOPPED = "leave-stopped"


def hold_stopped(spec: OciSpec, path: str) -> None:
    """Write the configuration to `path` and point the spec's annotation at it."""
    annotations = spec.setdefault("annotations", {})
    base = annotations.get(ANNOTATION, RUNC_DEFAULT)  # "" means: runc hands CRIU none
    lines: list[str] = []
    if base:  # the container's own, runc's default, or torpor's of this restore (tcp-close)
        try:
            with open(base) as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []  # runc's own default: CRIU ignores a file that is not there
    if os.path.abspath(base or "/") != os.path.abspath(path):
        lines.insert(0, f"# torpor: the CRIU configuration of a GPU restore ({base or 'none'}, "
                        f"then {LEAVE_STOPPED})")
    lines = [*lines, LEAVE_STOPPED]
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_atomic(path, ("\n".join(lines) + "\n").encode(), mode=0o600)
    annotations[ANNOTATION] = path
