"""torpor-hook: the OCI hook torpor-runc writes into a restored container's spec.

    torpor-hook [--state-dir DIR] HOOK_NAME      (the OCI state arrives on stdin)

createRuntime, during a restore, sets up the new network namespace from the plan torpor-runc left
for it (runc runs createRuntime hooks at CRIU's setup-namespaces step, before sockets are bound
again); at any other create (a spec carried over from an older torpor) it has nothing to do.
poststop removes the container's record directory. Other hook names warn and succeed: specs
travel to nodes with other torpor versions.
"""

from __future__ import annotations

import os
import sys

from torpor import fastjson
from torpor.capture import records
from torpor.formats import names

TYPE_CHECKING = False  # runs on every container start and stop: no typing, json, shutil
if TYPE_CHECKING:
    from typing import Any

KNOWN = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
DEFAULT_STATE_DIR = "/run/torpor"


def _warn(msg: str) -> None:
    sys.stderr.write(f"torpor-hook: {msg}\n")


def _read_state() -> dict[str, Any]:
    data = sys.stdin.buffer.read()
    state = fastjson.loads(data) if data.strip() else {}
    if not isinstance(state, dict):
        raise ValueError("OCI state on stdin is not a JSON object")
    return state


def create_runtime(state_dir: str, state: dict[str, Any]) -> int:
    bundle = str(state.get("bundle") or "")
    container_id = str(state.get("id") or "")
    if not bundle or not container_id:
        _warn("no bundle or id in the OCI state; nothing to do")
        return 0
    directory = records.record_dir(state_dir, bundle, container_id)
    plan = os.path.join(directory, names.RESTORE_PLAN)
    if os.path.exists(plan):
        from torpor.oci_hooks import netplan  # only during a restore

        netplan.apply(plan, int(state.get("pid") or 0))
    return 0


def poststop(state_dir: str, state: dict[str, Any]) -> int:
    bundle = str(state.get("bundle") or "")
    container_id = str(state.get("id") or "")
    if bundle and container_id:
        records.remove_record(records.record_dir(state_dir, bundle, container_id))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    state_dir = DEFAULT_STATE_DIR
    if len(args) >= 2 and args[0] == "--state-dir":
        state_dir, args = args[1], args[2:]
    if len(args) != 1:
        _warn("usage: torpor-hook [--state-dir DIR] HOOK_NAME  (OCI state on stdin)")
        return 2
    name = args[0]
    if name not in ("createRuntime", "poststop"):
        if name not in KNOWN:
            _warn(f"unknown hook {name!r}, ignored (written by another torpor version?)")
        return 0
    try:
        state = _read_state()
    except ValueError as e:
        _warn(str(e))
        return 0
    try:
        if name == "createRuntime":
            return create_runtime(state_dir, state)
        return poststop(state_dir, state)
    except Exception as e:  # report in words; runc shows the hook's stderr
        _warn(f"{name} failed: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
