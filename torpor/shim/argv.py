"""A scan of runc's argv: global flags, the subcommand, its flags and its positionals.

runc's flags are not re-declared here; the scan only needs to know which flags take a value so
that it can step over it. `-x`, `--x`, `--x=v`, `--x v` and go-runc's single-dash
`-no-subreaper` all work. Flags the scan does not know are taken as booleans and kept as they are.
Stdlib only: this runs on every container operation.
"""

from __future__ import annotations

# what Go's strconv.ParseBool reads as true, as runc (urfave/cli) reads `--flag=V`
GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})

# runc's global flags that take a value (runc 1.1: main.go).
GLOBAL_VALUE_FLAGS = frozenset({"root", "log", "log-format", "criu", "rootless"})

# Subcommand flags that take a value, for the subcommands torpor reads (runc 1.1).
COMMAND_VALUE_FLAGS: dict[str, frozenset[str]] = {
    "create": frozenset({"bundle", "b", "console-socket", "pid-file", "preserve-fds"}),
    "run": frozenset({"bundle", "b", "console-socket", "pid-file", "preserve-fds"}),
    "checkpoint": frozenset(
        {"image-path", "work-path", "parent-path", "page-server", "status-fd",
         "manage-cgroups-mode", "empty-ns", "lsm-profile", "lsm-mount-context"}
    ),
    "restore": frozenset(
        {"image-path", "work-path", "parent-path", "bundle", "b", "console-socket", "pid-file",
         "manage-cgroups-mode", "empty-ns", "lsm-profile", "lsm-mount-context", "status-fd"}
    ),
}


def subcommand(argv: list[str]) -> str | None:
    """The runc subcommand in argv, stepping over global flags and their values: all the fast
    path needs to decide between passing through and intercepting."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[i + 1] if i + 1 < len(argv) else None
        if not arg.startswith("-") or arg == "-":
            return arg
        if "=" not in arg and arg.lstrip("-") in GLOBAL_VALUE_FLAGS:
            i += 1
        i += 1
    return None


def _split(arg: str) -> tuple[str, str | None]:
    """'--log=x' -> ('log', 'x'); '-no-subreaper' -> ('no-subreaper', None)."""
    body = arg[2:] if arg.startswith("--") else arg[1:]
    name, eq, value = body.partition("=")
    return name, (value if eq else None)


class Invocation:
    """What torpor-runc was asked to do, with the original argv kept intact."""

    __slots__ = ("argv", "command", "command_index", "flags", "global_flags", "positionals")

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.global_flags: dict[str, str | bool] = {}
        self.command: str | None = None
        self.command_index = -1
        self.flags: dict[str, list[str | bool]] = {}
        self.positionals: list[str] = []
        self._scan()

    def _scan(self) -> None:
        argv, i = self.argv, 1
        while i < len(argv):
            arg = argv[i]
            if arg == "--" or not arg.startswith("-") or arg == "-":
                break
            name, value = _split(arg)
            if value is None and name in GLOBAL_VALUE_FLAGS and i + 1 < len(argv):
                i += 1
                value = argv[i]
            self.global_flags[name] = True if value is None else value
            i += 1
        if i < len(argv) and argv[i] == "--":
            i += 1
        if i >= len(argv):
            return
        self.command, self.command_index = argv[i], i
        value_flags = COMMAND_VALUE_FLAGS.get(argv[i], frozenset())
        i += 1
        flags_done = False
        while i < len(argv):
            arg = argv[i]
            if flags_done or not arg.startswith("-") or arg == "-":
                self.positionals.append(arg)
            elif arg == "--":
                flags_done = True
            else:
                name, value = _split(arg)
                if value is None and name in value_flags and i + 1 < len(argv):
                    i += 1
                    value = argv[i]
                self.flags.setdefault(name, []).append(True if value is None else value)
            i += 1

    # Accessors -----------------------------------------------------------------------------

    def flag(self, *names: str) -> str | None:
        """The last value of a subcommand flag given under any of `names`, or None."""
        for name in names:
            values = self.flags.get(name)
            if values:
                last = values[-1]
                return last if isinstance(last, str) else None
        return None

    def has(self, *names: str) -> bool:
        """Whether a boolean subcommand flag is set, as runc reads it: `--x`, or `--x=V` with V
        what Go's strconv.ParseBool takes for true (1, t, T, TRUE, true, True); the last one
        given wins."""
        for name in names:
            given = self.flags.get(name, ())
            if given and (given[-1] is True or given[-1] in GO_TRUE):
                return True
        return False

    def values(self, name: str) -> list[str]:
        return [v for v in self.flags.get(name, ()) if isinstance(v, str)]

    def global_flag(self, name: str) -> str | None:
        value = self.global_flags.get(name)
        return value if isinstance(value, str) else None

    @property
    def container_id(self) -> str | None:
        return self.positionals[-1] if self.positionals else None

    def with_flag_value(self, name: str, value: str) -> list[str]:
        """argv with every `--name V`/`--name=V` of the subcommand set to `value` (added if absent)."""
        argv, out, i, found = self.argv, [], 0, False
        while i < len(argv):
            arg = argv[i]
            if i > self.command_index and arg.startswith("-") and _split(arg)[0] == name:
                found = True
                if "=" in arg:
                    out.append(f"{arg.split('=', 1)[0]}={value}")
                else:
                    out.extend([arg, value])
                    i += 1
                i += 1
                continue
            out.append(arg)
            i += 1
        if not found:
            at = self.command_index + 1
            out[at:at] = [f"--{name}", value]
        return out

    def with_flags(self, extra: list[str]) -> list[str]:
        """argv with `extra` flags inserted right after the subcommand, everything else as is."""
        at = self.command_index + 1
        return [*self.argv[:at], *extra, *self.argv[at:]]
