"""The compiled front end speaks torpord's wire itself (frontend.c): `torpor` (the CLI's entry)
and torpor-runc's `checkpoint` hand the command to torpord without starting Python, and run the
Python program where torpord does not take it. The service here is a small one in this test,
reading requests with torpor.handoff's own parser (the real torpord runs in
tests/test_service.py); the front end is compiled with a stand-in Python that says it ran."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from torpor import handoff
from torpor.runtime_config.launchers import compile_frontend
from torpor.shim import served

ODD = 'quote " backslash \\ newline \n tab \t bell \x07 del \x7f é € 😀'


@dataclass
class Request:
    program: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    umask: int


@dataclass
class Service:
    """Answers every connection as `mode` says: "run" (accepted, a line on the caller's stdout,
    pid, exit 42), "refuse", "close" (accepted, then hang up), "wait" (accepted, the pid of a
    sleep this test started, its exit once it ended)."""
    path: str
    mode: str = "run"
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    sleeper: subprocess.Popen[bytes] | None = None
    ran: list[bytes] = field(default_factory=list)
    codes: list[int | None] = field(default_factory=list)
    fds: int = 0

    def serve(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                self.connections += 1
                self.answer(conn)

    def answer(self, conn: socket.socket) -> None:
        data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 4)
        try:
            line = handoff.LineReader(conn, data).line()
            if line is None:
                return   # the caller gave up before its request: it runs the command itself
            request = Request(*handoff.parse_request(handoff.decode(line)))
            self.requests.append(request)
            self.fds = len(fds)
            if len(fds) == 4:   # a restore: runc runs in the front end, as this side asks
                conn.sendall(handoff.encode({"accepted": True}) + handoff.encode({"pid": 1}))
                with socket.socket(fileno=os.dup(fds[3])) as channel:
                    status = self.runs(channel)
                if status >= 0:
                    conn.sendall(handoff.encode({"exit": status}))
                return
            if self.mode == "refuse":
                conn.sendall(handoff.encode({"refused": "torpord: not today " + "x" * 300}))
                return
            conn.sendall(handoff.encode({"accepted": True}))
            if self.mode == "close":
                return
            if self.mode == "wait":
                self.sleeper = subprocess.Popen(["sleep", "30"])
                conn.sendall(handoff.encode({"pid": self.sleeper.pid}))
                status = self.sleeper.wait(20)
                conn.sendall(handoff.encode({"exit": 128 - status}))
                return
            os.write(fds[1], f"served {' '.join(request.argv[1:])}\n".encode())
            conn.sendall(handoff.encode({"pid": 1234}) + handoff.encode({"exit": 42}))
        finally:
            for fd in fds:
                os.close(fd)


    def runs(self, channel: socket.socket) -> int:
        """torpord's child's side, torpor/shim/served.py itself: the front end runs a process
        and reports its status; past a deadline served.py kills it by its pid."""
        if self.mode == "child dies":   # the request, then the child is gone before it is read
            channel.sendall(b"\0".join([b"run", b"4", b"/bin/sh", b"-c", b'touch "$1"', b"sh",
                                         f"{self.path}.ran".encode(), b"0"]) + b"\0")
            return -1
        if self.mode == "channel closes":   # the child dies while the process runs
            channel.sendall(b"\0".join([b"run", b"2", b"/bin/sleep", b"30", b"0"]) + b"\0")
            self.ran.append(channel.recv(100))   # its pid
            return 5
        served.attach(os.dup(channel.fileno()))
        try:
            if self.mode == "deadline":
                started = time.monotonic()
                self.codes.append(served.run(["/bin/sh", "-c", "exec sleep 30"], 0.3))
                assert time.monotonic() - started < 10
            else:
                self.codes.append(served.run(
                    ["/bin/sh", "-c", 'echo "$PPID" > "$1"; exit 3', "sh", f"{self.path}.ppid"],
                    None))
        finally:
            served.attach(None)
        return 7


@dataclass
class FrontEnd:
    torpor: Path       # the front end as `torpor`
    runc: Path         # ... as torpor-runc
    bin_dir: Path      # a fake runc
    config: Path
    service: Service

    def env(self, **more: str) -> dict[str, str]:
        return {"PATH": str(self.bin_dir), "TORPOR_CONFIG": str(self.config), **more}

    def run(self, binary: Path, *args: str, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(binary), *args], env=env or self.env(), cwd=cwd,
                              capture_output=True, text=True, timeout=20)


def build(root: Path, config: str = "") -> tuple[Path, Path]:
    python = root / "python"
    python.write_text('#!/bin/sh\necho "python ran ${2##*/} ${TORPOR_RUNC_PATH:+self}'
                      '${TORPOR_CLI_PATH:+cli=$TORPOR_CLI_PATH}"\n')
    python.chmod(0o755)
    binary = root / "torpor-runc"
    if not compile_frontend(str(binary), str(python), str(root / "torpor-runc.py"),
                            config=config, cli=str(root / "torpor.py")):
        pytest.skip("no C compiler: the Python launchers stand in for the front end")
    cli = root / "cli" / "torpor"
    cli.parent.mkdir()
    shutil.copy2(binary, cli)
    return cli, binary


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build(tmp_path_factory.mktemp("front-end"))


@pytest.fixture
def front_end(tmp_path: Path, binaries: tuple[Path, Path]) -> Iterator[FrontEnd]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runc = bin_dir / "runc"
    runc.write_text('#!/bin/sh\necho "runc ran $*"\n')
    runc.chmod(0o755)
    sock = tmp_path / "torpord.sock"
    config = tmp_path / "config.toml"
    config.write_text(f'[service]\nsocket = "{sock}"\n')
    service = Service(str(sock))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(8)
    thread = threading.Thread(target=service.serve, args=(listener,), daemon=True)
    thread.start()
    cli, binary = binaries
    try:
        yield FrontEnd(cli, binary, bin_dir, config, service)
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(10)
        if service.sleeper is not None and service.sleeper.poll() is None:
            service.sleeper.kill()
            service.sleeper.wait()


def test_the_cli_hands_its_command_to_torpord_with_its_argv_env_directory_and_umask(
        front_end: FrontEnd, tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        result = front_end.run(front_end.torpor, "checkpoint", "web", "-o", "/d é",
                               env=front_end.env(TORPOR_TEST_ODD=ODD), cwd=tmp_path)
    finally:
        os.umask(old)
    assert (result.returncode, result.stdout) == (42, "served checkpoint web -o /d é\n")
    (request,) = front_end.service.requests
    assert request.program == "torpor"
    assert request.argv == [str(front_end.torpor), "checkpoint", "web", "-o", "/d é"]
    # by its bare name, from another directory: still its path (torpor finds torpor-runc
    # beside itself, never in the caller's directory)
    bare = subprocess.run(["torpor", "ls"], cwd=tmp_path, capture_output=True, text=True,
                          env=front_end.env(PATH=f"{front_end.torpor.parent}:/bin"), timeout=20)
    assert bare.returncode == 42
    assert front_end.service.requests[-1].argv == [str(front_end.torpor), "ls"]
    assert request.env == front_end.env(TORPOR_TEST_ODD=ODD)   # every byte, as Python sends it
    assert (request.cwd, request.umask) == (str(tmp_path), 0o027)


def test_torpor_runc_hands_its_checkpoint_to_torpord_and_nothing_else(
        front_end: FrontEnd) -> None:
    result = front_end.run(front_end.runc, "--root", "/r", "checkpoint", "--image-path", "/i",
                           "c1")
    assert (result.returncode, result.stdout) == (42, "served --root /r checkpoint --image-path "
                                                      "/i c1\n")
    (request,) = front_end.service.requests
    assert request.program == "torpor-runc"
    assert request.argv[0] == os.path.realpath(front_end.runc)   # as torpor-runc's Python says
    assert "TORPOR_RUNC_PATH" not in request.env
    # restore runs below the shim, every other call is runc's, help is runc's
    assert front_end.run(front_end.runc, "restore", "c1").stdout == \
        "python ran torpor-runc.py self\n"
    assert front_end.run(front_end.runc, "state", "c1").stdout == "runc ran state c1\n"
    assert front_end.run(front_end.runc, "checkpoint", "--help").stdout == \
        "runc ran checkpoint --help\n"
    assert len(front_end.service.requests) == 1


@pytest.mark.parametrize("why", ["refused", "no service", "TORPOR_NO_SERVICE", "not UTF-8",
                                 "config beyond the front end", "socket \"\""])
def test_what_torpord_does_not_take_runs_in_python(front_end: FrontEnd, why: str) -> None:
    env = front_end.env()
    if why == "refused":
        front_end.service.mode = "refuse"
    elif why == "no service":
        front_end.config.write_text(f'[service]\nsocket = "{front_end.config.parent / "none"}"\n')
    elif why == "TORPOR_NO_SERVICE":
        env["TORPOR_NO_SERVICE"] = "1"
    elif why == "config beyond the front end":   # tomllib's to read: Python decides
        front_end.config.write_text(f'service = {{ socket = "{front_end.service.path}" }}\n')
    elif why == "socket \"\"":
        front_end.config.write_text('[service]\nsocket = ""\n')
    args = [str(front_end.torpor), "ls"]
    if why == "not UTF-8":
        env_bytes = {k.encode(): v.encode() for k, v in env.items()}
        env_bytes[b"TORPOR_TEST_BYTES"] = b"\xff\xfe"
        result = subprocess.run(args, env=env_bytes, capture_output=True, text=True, timeout=20)
    else:
        result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=20)
    # the Python CLI is told where `torpor` is: its argv[0] as if it had been run itself
    assert (result.returncode, result.stdout) == (0, f"python ran torpor.py cli={front_end.torpor}\n")
    if why != "not UTF-8":
        runc = front_end.run(front_end.runc, "checkpoint", "c1", env=env)
        assert runc.stdout == "python ran torpor-runc.py self\n"
    if why != "refused":   # nothing was asked of the service
        assert front_end.service.requests == []


def test_a_service_that_hangs_up_mid_command_is_an_error_in_words(front_end: FrontEnd) -> None:
    front_end.service.mode = "close"
    result = front_end.run(front_end.torpor, "restore", "x")
    assert result.returncode == 1
    assert "torpor: error: torpord closed the connection while the command ran" in result.stderr


def test_signals_reach_the_command_in_torpord(front_end: FrontEnd) -> None:
    front_end.service.mode = "wait"
    proc = subprocess.Popen([str(front_end.torpor), "checkpoint", "web"], env=front_end.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while front_end.service.sleeper is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert front_end.service.sleeper is not None
        time.sleep(0.2)   # the pid's line reached the front end
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 128 + signal.SIGTERM   # the command's status, not the signal's
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert front_end.service.sleeper.returncode == -signal.SIGTERM


def test_a_prefix_installs_config_travels_as_the_python_launchers_set_it(
        tmp_path: Path) -> None:
    sock = tmp_path / "torpord.sock"
    config = tmp_path / "prefix.toml"
    config.write_text(f'[service]\nsocket = "{sock}"\n')
    service = Service(str(sock))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(sock))
        listener.listen(1)
        thread = threading.Thread(target=service.serve, args=(listener,), daemon=True)
        thread.start()
        cli, _ = build(tmp_path, config=str(config))
        result = subprocess.run([str(cli), "ls"], env={"PATH": "/bin"}, capture_output=True,
                                text=True, timeout=20)
        listener.shutdown(socket.SHUT_RDWR)
    thread.join(10)
    assert result.returncode == 42
    assert service.requests[0].env == {"PATH": "/bin", "TORPOR_CONFIG": str(config)}


@pytest.mark.parametrize("mode", ["run", "deadline", "child dies", "channel closes"])
def test_a_detached_restore_runs_runc_in_the_front_end_when_torpord_asks(
        front_end: FrontEnd, mode: str) -> None:
    """torpord's child does the restore's work; `runc restore` must run below the shim (the
    restored init is reparented to it), so the front end runs what the child asks (served.py)
    as its own child and reports its status; past a deadline the child kills it by its pid. A
    child that is gone before the front end reads its request has nothing run; one that dies
    while the process runs has it killed (nobody would supervise it)."""
    front_end.service.mode = mode
    proc = subprocess.Popen([str(front_end.runc), "restore", "--detach", "--bundle", "/b", "c1"],
                            env=front_end.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    _, err = proc.communicate(timeout=30)
    service = front_end.service
    assert service.fds == 4 and service.requests[0].program == "torpor-runc-served"
    if mode == "run":   # the process ran as the front end's child, its status came back
        assert (proc.returncode, service.codes) == (7, [3]), err
        assert Path(f"{service.path}.ppid").read_text().strip() == str(proc.pid)
    elif mode == "deadline":
        assert (proc.returncode, service.codes) == (7, [None]), err
    elif mode == "child dies":
        assert proc.returncode == 1 and "torpord closed the connection" in err, err
        time.sleep(0.5)
        assert not Path(f"{service.path}.ran").exists()
    else:
        assert proc.returncode == 5, err
        (kind, _, pid) = service.ran[0].partition(b"\0")
        assert kind == b"pid"
        with pytest.raises(ProcessLookupError):   # killed, and reaped by the front end
            os.kill(int(pid), 0)
    # a restore in the foreground, and any restore without torpord, runs in Python
    assert front_end.run(front_end.runc, "restore", "c1").stdout == \
        "python ran torpor-runc.py self\n"


def test_the_lines_the_front_end_reads_are_those_torpord_writes() -> None:
    """frontend.c compares these lines as they are (handoff.encode's compact form)."""
    assert handoff.encode({"accepted": True}) == b'{"accepted":true}\n'
    assert handoff.encode({"pid": 12}) == b'{"pid":12}\n'
    assert handoff.encode({"exit": 3}) == b'{"exit":3}\n'
