"""Prometheus metrics of the commands torpord ran, on a loopback address by default."""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from torpor import tally
from torpor.cli.main import LAZY_COMMANDS
from torpor.errors import ConfigError
from torpor.shim.argv import subcommand

_VALUED_OPTIONS = {"-a", "--address", "-n", "--namespace"}  # the CLI's global options with values
BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, float("inf"))


def command_of(argv: list[str], program: str = "torpor") -> str:
    """The verb of a `torpor` command line ("other" for none or an unknown one); torpor-runc's
    as "torpor-runc checkpoint"."""
    if program.startswith("torpor-runc"):   # its restore included (torpor-runc-served)
        return f"torpor-runc {subcommand(argv) or 'other'}"
    args = iter(argv[1:])
    for arg in args:
        if arg in _VALUED_OPTIONS:
            next(args, None)
        elif not arg.startswith("-"):
            return arg if arg in LAZY_COMMANDS else "other"
    return "other"


def exit_status(wait_status: int) -> int:
    """A shell's view of os.waitpid's status: the exit code, or 128 + the signal."""
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.waitstatus_to_exitcode(wait_status)


def failure_of(status: int, error: str) -> str:
    """The `error` label of a failed command: the error its child reported (a torpor error
    class, OSError, UsageError...), else Signal (killed: 128 + N) or ExitStatus."""
    if error.isidentifier():
        return error
    return "Signal" if status > 128 else "ExitStatus"


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"[service] metrics = {address!r} is not HOST:PORT",
                          hint='e.g. "127.0.0.1:9477", or "" for no metrics')
    return host.strip("[]"), int(port)


class Metrics:
    """torpor_commands_total{command,result}, torpor_command_duration_seconds{command},
    torpor_command_bytes_total{command,kind} and torpor_command_failures_total{command,error}
    (docs/service.md)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.commands = Counter("torpor_commands", "torpor commands torpord ran, by result",
                                ["command", "result"], registry=self.registry)
        self.durations = Histogram("torpor_command_duration_seconds",
                                   "wall time of torpor commands torpord ran", ["command"],
                                   buckets=BUCKETS, registry=self.registry)
        self.moved = Counter("torpor_command_bytes", "bytes torpor commands moved, by kind: "
                             "written (checkpoints on this node), pushed, downloaded (from "
                             "registries), local (restored from this node)",
                             ["command", "kind"], registry=self.registry)
        self.failures = Counter("torpor_command_failures", "failed torpor commands, by the "
                                "error that ended them", ["command", "error"],
                                registry=self.registry)
        self.server: Any = None

    def record(self, command: str, status: int, seconds: float, report: bytes = b"") -> None:
        """One command's outcome: its exit status and time, and what its child reported
        (torpor.tally's record; none from a child killed before it wrote one)."""
        moved, error = tally.parse_report(report)
        self.commands.labels(command, "success" if status == 0 else "failure").inc()
        self.durations.labels(command).observe(seconds)
        for kind, count in moved.items():
            self.moved.labels(command, kind).inc(count)
        if status != 0:
            self.failures.labels(command, failure_of(status, error)).inc()

    def serve(self, address: str) -> None:
        host, port = parse_address(address)
        self.server, _thread = start_http_server(port, addr=host, registry=self.registry)

    def listening_fd(self) -> int | None:
        return self.server.socket.fileno() if self.server is not None else None
