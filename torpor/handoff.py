"""torpord's wire, and its client: a command handed to torpord when it answers.

The `torpor` CLI (torpor/cli/handoff.py) and torpor-runc's checkpoint (torpor/shim/main.py) use
it before they import anything heavy: what the service saves is the interpreter's imports.
Stdlib only. One connect attempt to `[service] socket`; no socket, a refusal, a configuration
error or `TORPOR_NO_SERVICE=1`, and the caller runs the command in its own process.

The wire (docs/service.md), newline-delimited JSON over a unix stream socket:
  client -> service: {"program", "argv", "env", "cwd", "umask"} with fds 0, 1, 2 attached
                  (SCM_RIGHTS); program is "torpor" or "torpor-runc" (or, from torpor-runc's
                  compiled front end, "torpor-runc-served": its restore, with a fourth fd,
                  the channel of torpor/shim/served.py)
  service -> client: {"accepted": true} or {"refused": MESSAGE}, then {"pid": N}, then
                  {"exit": STATUS} (from the child itself, or from the service for a child
                  killed by a signal: 128 + the signal)
Nothing has run before "accepted": a client that sees the connection close before it runs the
command itself; after it, the command's outcome is the child's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_MESSAGE = 1 << 20
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# what a service's child runs: the CLI, torpor-runc, or torpor-runc's restore whose caller runs
# runc (the compiled front end, with its channel as a fourth fd: torpor/shim/served.py)
PROGRAMS = ("torpor", "torpor-runc", "torpor-runc-served")
SERVED_RUNC = "torpor-runc-served"


class ProtocolError(Exception):
    """A message that is not one line of JSON naming an object, or one too long."""


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError as e:
        raise ProtocolError(f"not JSON: {e}") from None
    if not isinstance(message, dict):
        raise ProtocolError("not a JSON object")
    return message


def request(argv: list[str], env: dict[str, str], cwd: str, umask: int,
            program: str = "torpor") -> bytes:
    return encode({"program": program, "argv": argv, "env": env, "cwd": cwd, "umask": umask})


def parse_request(message: dict[str, Any]) -> tuple[str, list[str], dict[str, str], str, int]:
    """(program, argv, env, cwd, umask); a request without "program" is the CLI's."""
    program = message.get("program", "torpor")
    if program not in PROGRAMS:
        raise ProtocolError(f"program must be one of {', '.join(PROGRAMS)}")
    argv, env, cwd, umask = (message.get(k) for k in ("argv", "env", "cwd", "umask"))
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise ProtocolError("argv must be a non-empty list of strings")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in env.items())):
        raise ProtocolError("env must map strings to strings")
    if not isinstance(cwd, str) or not isinstance(umask, int) or isinstance(umask, bool):
        raise ProtocolError("cwd must be a string and umask an integer")
    return program, argv, env, cwd, umask


class LineReader:
    """Whole lines from a stream socket (the first chunk may already have been read)."""

    def __init__(self, sock: socket.socket, pending: bytes = b"") -> None:
        self.sock = sock
        self.pending = pending

    def line(self) -> bytes | None:
        """The next line without its newline; None at end of stream."""
        while b"\n" not in self.pending:
            if len(self.pending) > MAX_MESSAGE:
                raise ProtocolError(f"message longer than {MAX_MESSAGE} bytes")
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line


def service_socket() -> str | None:
    """The socket to try, or None: TORPOR_NO_SERVICE=1, or a configuration this process must
    report itself (torpor.config is stdlib only and reads a plain file without tomllib)."""
    if os.environ.get("TORPOR_NO_SERVICE") == "1":
        return None
    from torpor import config
    from torpor.errors import ConfigError

    try:
        return config.load().service_socket or None
    except ConfigError:
        return None


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a unix socket (SO_PEERCRED: the one
    that connected, or that made a socketpair), as the kernel recorded them."""
    import struct

    ucred = struct.Struct("3i")
    pid, uid, gid = ucred.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                 ucred.size))
    return pid, uid, gid


def connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
    except OSError:  # none there, none listening, not ours to use
        sock.close()
        return None
    return sock


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def run_in_service(sock: socket.socket, program: str = "torpor",
                   argv: list[str] | None = None) -> int | None:
    """The command's exit status from the service, or None where it ran nothing. `argv`
    defaults to this process's."""
    with sock:
        try:
            socket.send_fds(sock, [request(sys.argv if argv is None else argv, dict(os.environ),
                                           os.getcwd(), _umask(), program)], [0, 1, 2])
            reader = LineReader(sock)
            first = reader.line()
        except OSError:
            return None
        if first is None or not decode(first).get("accepted"):
            return None
        child = 0

        def forward(signum: int, _frame: object) -> None:
            if child:
                os.kill(child, signum)

        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, forward)
        while True:
            try:
                line = reader.line()
            except InterruptedError:  # pragma: no cover - PEP 475 retries recv
                continue
            except OSError:
                line = None
            if line is None:
                sys.stderr.write(f"{program}: error: torpord closed the connection while the "
                                 f"command ran (pid {child}); its output above is all there "
                                 f"is\n")
                return 1
            message = decode(line)
            if "pid" in message:
                child = int(message["pid"])
            elif "exit" in message:
                return int(message["exit"])
