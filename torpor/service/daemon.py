"""torpord's loop: one thread, one selector over the control socket, the callers' connections
and a pidfd per child, so every fork happens in the one thread there is.

A connection: the peer is checked (peer.py), its request read with fds 0, 1, 2, "accepted"
sent, a child forked (child.py), its pid sent. The child reports its own exit status, so a
torpord killed meanwhile loses no answer; the service answers for a child that did not (killed
by a signal, or one that exec'd runc, as torpor-runc does for what runc answers itself: its
report pipe is empty), and records every child's status, time and report in the metrics. A
caller that goes away (its connection closes) has its command sent SIGTERM, as a terminal
closing on an in-process command would. SIGTERM stops the service: the socket goes, running commands run on.

Schedules (`torpor schedule add`, ops/schedule_book.py): about once a second the loop reads the
book, and forks a child for each schedule that is due and has no round running, the round
being `torpor checkpoint C -t REF --every D --rounds 1` run as any command is, its output
appended to `[runtime] log_dir`/schedule-NS-C.log; when it is reaped, its start, length and
exit status go into the book. The book lives in the image store, so schedules outlive a
restart of the service (a round due meanwhile runs at once); a round running when the service
is killed finishes on its own.
"""

from __future__ import annotations

import gc
import importlib
import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass

from torpor import config, handoff, tally
from torpor.capture import netns
from torpor.cli.main import LAZY_COMMANDS
from torpor.criu_images import reader
from torpor.errors import ConfigError, TorporError
from torpor.ops.schedule_book import Book, Entry
from torpor.service import child, peer
from torpor.service.lazy_metrics import LazyRestores
from torpor.service.metrics import Metrics, command_of, exit_status
from torpor.shim.argv import subcommand


class Stop(Exception):
    """SIGTERM or SIGINT: close the socket, leave the children to finish."""


@dataclass
class Job:
    pid: int
    pidfd: int
    conn: socket.socket
    command: str
    started: float
    caller_gone: bool = False
    schedule: Entry | None = None   # a schedule's round: no caller, its outcome to the book
    wall_started: float = 0.0
    report: int = -1                # the read end of the pipe the child reports on (tally)


def listen(path: str) -> socket.socket:
    """The control socket at `path`, mode 0600; refused where a live torpord holds it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if os.path.exists(path):
        if handoff.connect(path) is not None:
            raise TorporError(f"another torpord answers on {path}")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


class Service:
    def __init__(self, socket_path: str, metrics: Metrics, book: Book | None = None,
                 log_dir: str = "") -> None:
        self.path = socket_path
        self.metrics = metrics
        self.book, self.log_dir = book, log_dir
        self.rounds: dict[tuple[str, str], Job] = {}   # schedule -> its round running
        self._book_error = ""
        self.selector = selectors.DefaultSelector()
        self.listener = listen(socket_path)
        self.jobs: dict[int, Job] = {}  # pidfd -> job
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")

    def serve(self) -> None:
        try:
            while True:
                events = self.selector.select(timeout=SCHEDULE_TICK_S if self.book else None)
                for key, _ in events:
                    if key.data == "accept":
                        self.accept()
                    elif key.data == "child":
                        if key.fd in self.jobs:
                            self.reap(self.jobs[key.fd])
                    elif key.data.pidfd in self.jobs and not key.data.caller_gone:
                        self.caller_gone(key.data)  # not one reaped earlier in this batch
                self.run_due()
        except Stop:
            pass
        finally:
            self.selector.unregister(self.listener)
            self.listener.close()
            if os.path.exists(self.path):
                os.unlink(self.path)

    def accept(self) -> None:
        """Refusals only before "accepted": after it, the command is the child's."""
        conn, _ = self.listener.accept()
        try:
            request = self.read_request(conn)
        except (OSError, handoff.ProtocolError) as e:
            try:
                conn.sendall(handoff.encode({"refused": f"torpord: {e}"}))
            except OSError:
                pass
            conn.close()
            return
        if request is not None:
            self.start(conn, *request)

    def read_request(self, conn: socket.socket,
                     ) -> tuple[list[int], str, list[str], dict[str, str], str, int] | None:
        """The peer's fds and request, "accepted" sent; None where the peer was refused."""
        _pid, uid, _gid = peer.peer_credentials(conn)
        why = peer.refusal(uid)
        if why is not None:
            conn.sendall(handoff.encode({"refused": why}))
            conn.close()
            return None
        conn.settimeout(10)
        data, fds, flags, _addr = socket.recv_fds(conn, 65536, 5)
        try:
            line = handoff.LineReader(conn, data).line()
            if line is None or flags & socket.MSG_CTRUNC or len(fds) not in (3, 4):
                raise handoff.ProtocolError("a request needs one line and fds 0, 1 and 2")
            program, argv, env, cwd, umask = handoff.parse_request(handoff.decode(line))
            served = program == handoff.SERVED_RUNC
            if served != (len(fds) == 4) or (served and not (
                    subcommand(argv) == "restore" and _is_seqpacket(fds[3]))):
                raise handoff.ProtocolError(f"{handoff.SERVED_RUNC} is torpor-runc's restore, "
                                            "with its channel (a SOCK_SEQPACKET socket) as a "
                                            "fourth fd; nothing else hands one over")
            conn.settimeout(None)
            conn.sendall(handoff.encode({"accepted": True}))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds, program, argv, env, cwd, umask

    def start(self, conn: socket.socket, fds: list[int], program: str, argv: list[str],
              env: dict[str, str], cwd: str, umask: int) -> None:
        report, report_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            started = time.monotonic()
            pid = os.fork()
            if pid == 0:
                child.run(conn, fds, argv, env, cwd, umask, self.inherited(report), report_w,
                          program)
        except BaseException:
            os.close(report)
            raise
        finally:
            for fd in (*fds, report_w):
                os.close(fd)
        job = Job(pid, os.pidfd_open(pid), conn, command_of(argv, program), started,
                  report=report)
        self.jobs[job.pidfd] = job
        self.selector.register(job.pidfd, selectors.EVENT_READ, "child")
        self.selector.register(conn, selectors.EVENT_READ, job)
        try:
            conn.sendall(handoff.encode({"pid": pid}))
        except OSError:
            pass

    def inherited(self, *more: int) -> list[int]:
        """The service's fds that a child closes first: the sockets, the other children's."""
        close = [self.listener.fileno(), self.selector.fileno(), *more,
                 *(fd for job in self.jobs.values()
                   for fd in (job.pidfd, job.conn.fileno(), job.report))]
        metrics_fd = self.metrics.listening_fd()
        if metrics_fd is not None:
            close.append(metrics_fd)
        return close

    def run_due(self) -> None:
        """A round for every schedule that is due and has none running."""
        if self.book is None:
            return
        try:
            entries = self.book.read()
        except TorporError as e:
            if str(e) != self._book_error:   # said once, not every second
                self._book_error = str(e)
                sys.stderr.write(f"torpord: schedules: {e}\n")
            return
        now = time.time()
        for entry in entries:
            if entry.key not in self.rounds and entry.next_due() <= now:
                self.start_round(entry)

    def start_round(self, entry: Entry) -> None:
        os.makedirs(self.log_dir, mode=0o700, exist_ok=True)
        log = os.open(os.path.join(self.log_dir, f"schedule-{entry.namespace}-"
                                                 f"{entry.container}.log"),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        report, report_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            os.write(log, time.strftime("--- %Y-%m-%dT%H:%M:%SZ round\n", time.gmtime()).encode())
            started, wall = time.monotonic(), time.time()
            pid = os.fork()
            if pid == 0:
                child.run(theirs, [null, log, os.dup(log)], entry.argv(), dict(os.environ),
                          "/", 0o077, self.inherited(ours.fileno(), report), report_w)
        except BaseException:
            os.close(report)
            raise
        finally:
            for fd in (log, null, report_w):
                os.close(fd)
            theirs.close()
        job = Job(pid, os.pidfd_open(pid), ours, command_of(entry.argv()), started,
                  caller_gone=True, schedule=entry, wall_started=wall, report=report)
        self.jobs[job.pidfd] = job
        self.rounds[entry.key] = job
        self.selector.register(job.pidfd, selectors.EVENT_READ, "child")

    def caller_gone(self, job: Job) -> None:
        """The caller's connection is readable: it sends nothing more, so it closed."""
        self.selector.unregister(job.conn)
        job.caller_gone = True
        try:
            os.kill(job.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def reap(self, job: Job) -> None:
        _, wait_status = os.waitpid(job.pid, 0)
        status = exit_status(wait_status)
        report = read_report(job.report)
        self.metrics.record(job.command, status, time.monotonic() - job.started, report)
        os.close(job.report)
        self.selector.unregister(job.pidfd)
        os.close(job.pidfd)
        del self.jobs[job.pidfd]
        if job.schedule is not None:
            self.rounds.pop(job.schedule.key, None)
            if self.book is not None:
                try:
                    self.book.record(job.schedule.key, job.wall_started,
                                     time.monotonic() - job.started, status)
                except (TorporError, OSError) as e:
                    sys.stderr.write(f"torpord: schedules: {e}\n")
        if not job.caller_gone:
            self.selector.unregister(job.conn)
            if not report:   # the child could not say it: killed, or it exec'd (runc's answer)
                try:
                    job.conn.sendall(handoff.encode({"exit": status}))
                except OSError:
                    pass
        job.conn.close()


SCHEDULE_TICK_S = 1.0   # how often the book is read for rounds due


def _is_seqpacket(fd: int) -> bool:
    import stat

    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        return False
    with socket.socket(fileno=os.dup(fd)) as channel:
        return channel.type == socket.SOCK_SEQPACKET


def read_report(fd: int) -> bytes:
    """What a reaped child wrote on its report pipe: its one line, or b"" (killed first; the
    pipe is non-blocking, so a grandchild holding the write end open cannot stall the loop)."""
    try:
        return os.read(fd, tally.MAX_REPORT)
    except BlockingIOError:
        return b""


# imported on first use, in every child that uses them: grpc's channel (every containerd call)
LAZY_IMPORTS = ("grpc._channel", "grpc._simple_stubs", "grpc.experimental")


def warm_up() -> None:
    """Import every command once, torpor-runc's checkpoint, pyroute2's modules, grpc's lazy ones
    and CRIU's image definitions (~25 ms, every restore's check) with it, so that each child
    starts with them loaded."""
    for module in (*(m for m, _ in LAZY_COMMANDS.values()), "torpor.shim.main",
                   *child.RUNTIME_MODULES, *LAZY_IMPORTS):
        importlib.import_module(module)
    netns.preload()
    try:
        reader.definitions()
    except TorporError:
        pass   # not installed: each restore says so, in its words
    gc.collect()
    gc.freeze()  # what the imports made stays shared with the children (copy-on-write)


def _stop(_signum: int, _frame: object) -> None:
    raise Stop()


USAGE = """usage: torpord [--ping]

Run torpor's node service on [service] socket (docs/service.md); with --ping, exit 0 when a
torpord answers on that socket and 1 when none does (for installers and probes).
"""


def ping(cfg: config.Config) -> int:
    sock = handoff.connect(cfg.service_socket) if cfg.service_socket else None
    if sock is None:
        sys.stderr.write(f"torpord: none answers on {cfg.service_socket or '(no socket)'}\n")
        return 1
    sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--ping"]):
        sys.stderr.write(USAGE)
        return 0 if args in (["-h"], ["--help"]) else 2
    try:
        cfg = config.load()
        if args == ["--ping"]:
            return ping(cfg)
        if not cfg.service_socket:
            raise ConfigError("[service] socket is empty: torpord needs a socket to listen on")
        warm_up()
        metrics = Metrics()
        metrics.registry.register(LazyRestores(cfg.runtime_state_dir))
        if cfg.service_metrics:
            metrics.serve(cfg.service_metrics)
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        service = Service(cfg.service_socket, metrics, Book(cfg.image_store),
                          cfg.runtime_log_dir)
    except (TorporError, OSError) as e:
        sys.stderr.write(f"torpord: error: {e}\n")
        return e.exit_code if isinstance(e, TorporError) else 1
    sys.stderr.write(f"torpord: listening on {cfg.service_socket}"
                     + (f", metrics on http://{cfg.service_metrics}/metrics\n"
                        if cfg.service_metrics else "\n"))
    service.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
