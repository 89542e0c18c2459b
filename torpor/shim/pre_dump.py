"""CRIU's pre-dump hook: a checkpoint that leaves its container running freezes it at the last
moment.

torpor freezes a container itself, so that the files it saves match the memory CRIU dumps, and
freezes it fast (it looks every millisecond where CRIU, finding a cgroup still freezing, sleeps
100 ms). Freezing before `runc checkpoint` starts would make the workload wait through runc's
and CRIU's own start-up as well (40-50 ms here). So, for --leave-running:

 1. torpor-runc writes this hook (sh, no Python) and CRIU's configuration (the caller's
    CRIU_CONFIG_FILE, if any, plus `action-script`), and runs runc with CRIU_CONFIG_FILE naming
    it: the CRIU that runc starts reads it (swrk mode included) besides runc's own file;
 2. CRIU runs the pre-dump action just before it seizes the processes: the hook leaves a mark,
    then freezes the cgroup, looking at its state until it is frozen (writing FROZEN again now
    and then, as a v1 freezer can need); CRIU finds it frozen, dumps it and leaves it so;
 3. once runc returns, torpor-runc saves the files, the container still frozen, and thaws it
    (the mark says the hook froze it). A hook that cannot freeze thaws and fails: CRIU stops
    and runc's error says why.
Every other action exits 0.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile

from torpor.capture.freezer import Cgroup
from torpor.shim.post_dump import write_action_config

HOOK = "pre-dump"
CONFIG = "criu-pre-dump.conf"
MARK = "pre-dump-froze"

HEADER = """#!/bin/sh
# torpor: CRIU's pre-dump hook (torpor.shim.pre_dump): freeze the container at the last moment
[ "$CRTOOLS_SCRIPT_ACTION" = pre-dump ] || exit 0
: > {mark} || exit 1
n=0
while [ $n -lt 2500 ]; do
"""
V1 = """    echo FROZEN > {cg}/freezer.state || exit 1
    i=0
    while [ $i -lt 100 ]; do
        read s < {cg}/freezer.state
        [ "$s" = FROZEN ] && exit 0
        i=$((i + 1))
    done
"""
V2 = """    echo 1 > {cg}/cgroup.freeze || exit 1
    i=0
    while [ $i -lt 100 ]; do
        while read k v; do [ "$k" = frozen ] && [ "$v" = 1 ] && exit 0; done < {cg}/cgroup.events
        i=$((i + 1))
    done
"""
FOOTER = """    n=$((n + 1))
    sleep 0.002
done
{thaw}
echo "torpor: the container's cgroup did not freeze within 5 s" >&2
exit 1
"""


class PreDumpHook:
    """The hook for one `runc checkpoint`: where it lives, and what it did."""

    def __init__(self, directory: str, cgroup: Cgroup, own_directory: bool,
                 criu_lines: tuple[str, ...] = ()) -> None:
        self.directory = directory
        self._own = own_directory
        script = os.path.join(directory, HOOK)
        cg = shlex.quote(cgroup.path)
        body = V1 if cgroup.version == 1 else V2
        thaw = (f"echo THAWED > {cg}/freezer.state" if cgroup.version == 1
                else f"echo 0 > {cg}/cgroup.freeze")
        mark = shlex.quote(os.path.join(directory, MARK))
        with open(script, "w") as f:
            f.write(HEADER.format(mark=mark) + body.format(cg=cg) + FOOTER.format(thaw=thaw))
        os.chmod(script, 0o700)
        self.config = os.path.join(directory, CONFIG)
        write_action_config(self.config, script, criu_lines)

    @classmethod
    def install(cls, cgroup: Cgroup, directory: str | None, state_dir: str,
                criu_lines: tuple[str, ...] = ()) -> PreDumpHook:
        """In `directory` (the checkpoint's journal), or a private one under `state_dir`;
        `criu_lines`: more of CRIU's options for its configuration."""
        if directory is not None:
            return cls(directory, cgroup, own_directory=False, criu_lines=criu_lines)
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        return cls(tempfile.mkdtemp(prefix="pre-dump-", dir=state_dir), cgroup,
                   own_directory=True, criu_lines=criu_lines)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return {**(base if base is not None else os.environ), "CRIU_CONFIG_FILE": self.config}

    def froze(self) -> bool:
        """Whether the hook ran, and so may have frozen the container."""
        return os.path.exists(os.path.join(self.directory, MARK))

    def remove(self) -> None:
        if self._own:
            shutil.rmtree(self.directory, ignore_errors=True)
            return
        for name in (HOOK, CONFIG, MARK):
            try:
                os.unlink(os.path.join(self.directory, name))
            except FileNotFoundError:
                pass
