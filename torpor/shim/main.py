"""torpor-runc: a runc-compatible OCI runtime that hands almost everything to runc.

containerd's runc shim, podman or CRI-O run this in place of runc. A plain scan of argv decides:
the subcommands in DISPATCH (checkpoint and restore) get torpor's treatment, and every other call
is `execve`d to the low-level runtime untouched, so argv, stdio, inherited fds, signals and the
exit status stay runc's. Where the node's `[restore] on_create` is on, a `create` whose spec
carries a checkpoint image's mark, and the `start` of a container restored so, go to ON_CREATE
(on_create_check.py decides, with one read of config.json or one stat). Installed
launchers put a compiled front end (frontend.c) before this program, which does the same scan
and execs runc without starting Python; this module is what it runs for checkpoint and restore,
and the whole of torpor-runc where no C compiler was found.

This module is the fast path: it imports `os`, `sys`, `torpor.shim.lowlevel` and the argv scan
(`torpor.shim.argv`, stdlib only) and nothing else before the decision (each extra module costs
about a millisecond on every container operation). Configuration and the error tree are
imported only when they are needed.

`checkpoint` goes to torpord when it answers (the compiled front end tries first, then this
program with torpor.handoff, stdlib only: one connect to `[service] socket`): torpord's child
runs this same main with this process's argv, environment, directory and fds 0-2, its imports
(pyroute2's among them) already paid, and its exit status becomes this process's; its --log
lines are written by that child, as they would be here. No torpord, a refusal or
TORPOR_NO_SERVICE=1: it runs here. `restore` goes there only from the front end: runc
restore's detached container init must be reparented to containerd's shim (a subreaper, which
waits for it and reports its exit), so the front end runs `runc restore` itself when torpord's
child asks (torpor.shim.served, docs/service.md).
"""

from __future__ import annotations

import os
import sys

from torpor.shim import lowlevel
from torpor.shim.argv import subcommand

TYPE_CHECKING = False
if TYPE_CHECKING:
    from torpor.config import Config
    from torpor.shim.argv import Invocation

# subcommand -> module with `run(ctx) -> int`; anything else goes straight to runc. The compiled
# front end (frontend.c) intercepts the same subcommands: keep the two lists equal.
DISPATCH = {
    "checkpoint": "torpor.shim.checkpoint_cmd",
    "restore": "torpor.shim.restore_cmd",
}
# what this program hands to torpord when it answers; the compiled front end also hands over
# `restore --detach`, with the channel through which it runs runc itself (served.py)
SERVED = frozenset({"checkpoint"})
# ... and these, where `[restore] on_create` is on and on_create_check.intercepts says so
ON_CREATE = {
    "create": "torpor.shim.create_cmd",
    "start": "torpor.shim.start_cmd",
}


def _config_runtime() -> tuple[str, bool, Config | None]:
    """runc's name or path from the config and whether `[restore] on_create` is on; no file
    means "runc" and off, and plain files are read without importing tomllib (the full parse
    happens for intercepted subcommands)."""
    explicit = os.environ.get("TORPOR_CONFIG")
    path = explicit or "/etc/torpor/config.toml"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if not explicit:
            return "runc", False, None
        text = None
    except (OSError, UnicodeDecodeError):
        text = None
    if text is not None:
        from torpor.config import fast_runtime_path

        fast = fast_runtime_path(text)
        if fast is not None:
            return fast[0], fast[1], None
    from torpor import config  # reports what is wrong with the file

    cfg = config.load()
    return cfg.runtime_path, cfg.restore_on_create != "off", cfg


class Context:
    """What an intercepted subcommand gets: the scanned argv, runc's path, config and log."""

    __slots__ = ("cfg", "inv", "log", "runtime")

    def __init__(self, inv: Invocation, runtime: str, cfg: Config):
        from torpor.shim.runclog import RuncLog

        self.inv = inv
        self.runtime = runtime
        self.cfg = cfg
        self.log = RuncLog(inv)

    def hook_path(self) -> str:
        if self.cfg.runtime_hook_path:
            return self.cfg.runtime_hook_path
        here = os.path.dirname(os.path.realpath(sys.argv[0]))
        return os.path.join(here, "torpor-hook")


def main(argv: list[str] | None = None, in_service: bool = False) -> int:
    """torpor-runc; `in_service`: run by torpord's child, which never hands off again."""
    # run by the compiled front end: argv[0] is our script, the front end says where it is
    front_end = os.environ.pop("TORPOR_RUNC_PATH", None)
    if front_end and argv is None:
        sys.argv[0] = front_end
    argv = list(sys.argv if argv is None else argv)
    try:
        runtime_name, on_create, cfg = _config_runtime()
        runtime = lowlevel.resolve(runtime_name)
        command = subcommand(argv) or ""
        module_name = DISPATCH.get(command)
        if module_name is None and on_create and command in ON_CREATE:
            from torpor.shim import on_create_check

            if on_create_check.intercepts(command, argv):
                module_name = ON_CREATE[command]
        if module_name is None:
            lowlevel.exec_runtime(runtime, argv)
            return 0  # not reached
        if command in SERVED and not in_service:
            status = _in_service(argv)
            if status is not None:
                return status
        if in_service and command == "restore":
            from torpor.errors import RestoreError
            from torpor.shim import served

            if not served.active():   # runc would restore the container below torpord
                raise RestoreError("torpord runs torpor-runc's restore only for the front end "
                                   "that hands over its channel (frontend.c)")
        return _intercept(argv, module_name, runtime, cfg)
    except Exception as e:
        return _fail(argv, e)
    except KeyboardInterrupt:
        return _fail(argv, KeyboardInterrupt())


def _in_service(argv: list[str]) -> int | None:
    """The command's exit status from torpord, None where none answered (run it here)."""
    from torpor import handoff

    path = handoff.service_socket()
    sock = handoff.connect(path) if path else None
    return handoff.run_in_service(sock, "torpor-runc", argv) if sock is not None else None


def _intercept(argv: list[str], module_name: str, runtime: str, cfg: Config | None) -> int:
    from torpor import config
    from torpor.shim.argv import Invocation

    module = __import__(module_name, fromlist=["run"])
    code: int = module.run(Context(Invocation(argv), runtime, cfg or config.load()))
    return code


def _fail(argv: list[str], error: BaseException) -> int:
    """Report in runc's log format, where containerd looks; bugs also get their traceback."""
    from torpor.errors import TorporError
    from torpor.shim.argv import Invocation
    from torpor.shim.runclog import RuncLog

    log = RuncLog(Invocation(argv))
    if isinstance(error, TorporError):
        log.error(str(error))
        if subcommand(argv) in ("checkpoint", "restore") and log.path:
            # the shim reports the first line of these commands' output, not the log
            sys.stderr.write(f"torpor: {' '.join(str(error).split())}\n")
            sys.stderr.flush()
        # runc's own words, verbatim, after torpor's (runc wrote them to --log itself)
        os.write(2, getattr(error, "runtime_output", b""))
        return error.exit_code
    if isinstance(error, KeyboardInterrupt):
        log.error("interrupted")
        return 130
    import traceback

    detail = "".join(traceback.format_exception_only(type(error), error)).strip()
    log.error(f"internal error in torpor-runc {subcommand(argv) or ''}: {detail}")
    traceback.print_exception(error, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
