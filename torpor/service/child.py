"""One command in a child of torpord: the caller's fds, directory, environment and argv, then
the same main the caller would have run in-process (the CLI's click main, or torpor-runc's for
its checkpoint); its exit status goes back on the connection, and
what it moved and the error that ended it (torpor.tally's report) to the service, in one write
to `report_fd` (a pipe) just before: a child killed before it leaves the pipe empty."""

from __future__ import annotations

import io
import os
import signal
import socket
import sys

from torpor import handoff, tally
from torpor.cli.main import main as cli_main
from torpor.shim import served
from torpor.shim.main import main as runtime_main

# what torpor-runc's checkpoint and restore import (the GPU's modules with or without a GPU)
RUNTIME_MODULES = ("torpor.shim.checkpoint_cmd", "torpor.gpu.session", "torpor.shim.restore_cmd",
                   "torpor.gpu.restore")


def _stream(fd: int, write: bool) -> io.TextIOWrapper:
    """A fresh text stream on fd (the service's were made for its own stdio)."""
    tty = os.isatty(fd)
    raw = io.FileIO(fd, "w" if write else "r", closefd=False)
    buffered = io.BufferedWriter(raw) if write else io.BufferedReader(raw)
    return io.TextIOWrapper(buffered, encoding="utf-8",
                            errors="backslashreplace" if fd == 2 else "strict",
                            line_buffering=write and tty, write_through=fd == 2)


def run(conn: socket.socket, fds: list[int], argv: list[str], env: dict[str, str], cwd: str,
        umask: int, close: list[int], report_fd: int, program: str = "torpor") -> None:
    """In the forked child: never returns."""
    status = 1
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        for fd in close:
            os.close(fd)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in set(fds[:3]) - {0, 1, 2}:
            os.close(fd)
        if len(fds) == 4:   # torpor-runc's restore: runc runs in the caller (shim/served.py)
            served.attach(fds[3])
            for signum in handoff.FORWARDED_SIGNALS:   # ends through the channel, cleaned up
                signal.signal(signum, signal.SIG_IGN)
        os.umask(umask)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = list(argv)
        sys.stdin, sys.stdout, sys.stderr = _stream(0, False), _stream(1, True), _stream(2, True)
        os.chdir(cwd)
        status = runtime_main(in_service=True) if program.startswith("torpor-runc") \
            else cli_main()
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
    except BaseException as e:  # the child reports every failure, then exits
        tally.failed(type(e).__name__)
        try:
            sys.stderr.write(f"torpor: error: {e}\n")
        except BaseException:
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # a closed pipe: nothing more to say there
                pass
        # from here on the status stands: a SIGTERM the service sends when the caller, told it,
        # hangs up must not turn it into 143 (ignored for the process: a mask would be this
        # thread's only, and grpc's threads would take the signal)
        for signum in handoff.FORWARDED_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        try:   # before the exit status: the service has it when it reaps this child
            os.write(report_fd, tally.report())
        except OSError:
            pass
        try:
            conn.sendall(handoff.encode({"exit": status}))
        except OSError:
            pass
        os._exit(status & 0xFF)
