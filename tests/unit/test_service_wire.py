"""torpord's wire and its small pieces (torpor/handoff.py, torpor/service/): pure tables and
a socketpair, no daemon."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from torpor import handoff, tally
from torpor.errors import ConfigError
from torpor.service import peer
from torpor.service.daemon import read_report
from torpor.service.metrics import Metrics, command_of, exit_status, parse_address


def test_a_request_goes_over_a_socket_with_its_fds_in_pieces() -> None:
    env = {"PATH": "/bin", "ODD": "caf\udce9"}  # a non-UTF-8 byte, as os.environ holds it
    line = handoff.request(["torpor", "ls"], env, "/tmp", 0o022)
    a, b = socket.socketpair()
    with a, b:
        socket.send_fds(a, [line[:7]], [0, 1, 2])
        a.sendall(line[7:] + handoff.encode({"pid": 5}))
        data, fds, _, _ = socket.recv_fds(b, 65536, 3)
        reader = handoff.LineReader(b, data)
        first = reader.line()
        assert first is not None
        assert handoff.parse_request(handoff.decode(first)) == \
            ("torpor", ["torpor", "ls"], env, "/tmp", 18)
        assert reader.line() == b'{"pid":5}'
        a.close()
        assert reader.line() is None
    assert len(fds) == 3 and all(os.path.samestat(os.fstat(fd), os.fstat(n))
                                 for n, fd in enumerate(fds))
    for fd in fds:
        os.close(fd)


@pytest.mark.parametrize("message, wrong", [
    ({"argv": [], "env": {}, "cwd": "/", "umask": 18}, "argv"),
    ({"argv": ["torpor", 1], "env": {}, "cwd": "/", "umask": 18}, "argv"),
    ({"argv": ["torpor"], "env": {"A": 1}, "cwd": "/", "umask": 18}, "env"),
    ({"argv": ["torpor"], "env": {}, "cwd": None, "umask": 18}, "cwd"),
    ({"argv": ["torpor"], "env": {}, "cwd": "/", "umask": True}, "umask"),
    ({"program": "sh", "argv": ["sh"], "env": {}, "cwd": "/", "umask": 18}, "program"),
])
def test_bad_requests_are_named(message: dict[str, object], wrong: str) -> None:
    with pytest.raises(handoff.ProtocolError, match=wrong):
        handoff.parse_request(message)


@pytest.mark.parametrize("line", [b"nope", b"[1]", b'"x"'])
def test_a_message_is_one_json_object(line: bytes) -> None:
    with pytest.raises(handoff.ProtocolError):
        handoff.decode(line)


def test_an_endless_line_is_refused() -> None:
    a, b = socket.socketpair()
    with a, b:
        reader = handoff.LineReader(b, b"x" * (handoff.MAX_MESSAGE + 1))
        with pytest.raises(handoff.ProtocolError, match="longer"):
            reader.line()


@pytest.mark.parametrize("argv, command", [
    (["torpor", "checkpoint", "web", "-o", "d"], "checkpoint"),
    (["torpor", "-n", "k8s.io", "restore", "d"], "restore"),
    (["torpor", "--address", "/x.sock", "--debug", "push", "r"], "push"),
    (["torpor", "--namespace=x", "pull", "r"], "pull"),
    (["torpor", "frobnicate"], "other"),
    (["torpor", "--help"], "other"),
    (["torpor"], "other"),
])
def test_the_command_of_an_argv(argv: list[str], command: str) -> None:
    assert command_of(argv) == command


def test_torpor_runc_is_a_program_of_its_own() -> None:
    line = handoff.request(["torpor-runc", "--log", "l.json", "checkpoint", "c1"], {}, "/", 18,
                           "torpor-runc")
    program, argv, *_ = handoff.parse_request(handoff.decode(line.rstrip()))
    assert program == "torpor-runc"
    assert command_of(argv, program) == "torpor-runc checkpoint"
    assert handoff.parse_request({"argv": ["torpor"], "env": {}, "cwd": "/", "umask": 0})[0] \
        == "torpor"   # a client from before programs were named


def test_exit_statuses_read_as_a_shell_reads_them() -> None:
    assert exit_status(0) == 0
    assert exit_status(3 << 8) == 3
    assert exit_status(signal.SIGKILL) == 128 + signal.SIGKILL


@pytest.mark.parametrize("uid, own, refused", [(0, 0, False), (1000, 1000, False),
                                               (65534, 0, True), (0, 1000, False),
                                               (1001, 1000, True)])
def test_only_root_or_the_services_user_may_connect(uid: int, own: int, refused: bool) -> None:
    why = peer.refusal(uid, own)
    assert (why is not None) == refused
    if why:
        assert f"uid {uid}" in why and "TORPOR_NO_SERVICE=1" in why


def test_the_kernel_names_the_peer() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert peer.peer_credentials(b) == (os.getpid(), os.getuid(), os.getgid())


@pytest.mark.parametrize("address, parsed", [("127.0.0.1:9477", ("127.0.0.1", 9477)),
                                             ("[::1]:9", ("::1", 9))])
def test_metrics_addresses(address: str, parsed: tuple[str, int]) -> None:
    assert parse_address(address) == parsed


@pytest.mark.parametrize("address", ["9477", "localhost:", ":9477", "h:p"])
def test_bad_metrics_addresses_are_named(address: str) -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_address(address)


def test_metrics_count_commands_by_result() -> None:
    metrics = Metrics()
    metrics.record("checkpoint", 0, 0.3)
    metrics.record("checkpoint", 1, 0.2)
    metrics.record("restore", 0, 0.4)
    value = metrics.registry.get_sample_value
    assert value("torpor_commands_total", {"command": "checkpoint", "result": "success"}) == 1
    assert value("torpor_commands_total", {"command": "checkpoint", "result": "failure"}) == 1
    assert value("torpor_command_duration_seconds_count", {"command": "checkpoint"}) == 2
    assert value("torpor_command_duration_seconds_sum", {"command": "restore"}) == 0.4


def test_metrics_count_bytes_and_failures_from_the_childs_report() -> None:
    metrics = Metrics()
    metrics.record("checkpoint", 0, 0.3, b'{"bytes":{"written":100,"pushed":40},"error":""}\n')
    metrics.record("restore", 0, 0.4, b'{"bytes":{"downloaded":7,"local":5},"error":""}\n')
    metrics.record("restore", 3, 0.1, b'{"bytes":{},"error":"IncompatibleNode"}\n')
    metrics.record("restore", 137, 0.1, b"")             # killed before it reported
    metrics.record("push", 1, 0.1, b'{"bytes":{"pushed":-1,"bogus":5},"error":"no such"}')
    value = metrics.registry.get_sample_value
    assert value("torpor_command_bytes_total", {"command": "checkpoint", "kind": "written"}) == 100
    assert value("torpor_command_bytes_total", {"command": "checkpoint", "kind": "pushed"}) == 40
    assert value("torpor_command_bytes_total", {"command": "restore", "kind": "downloaded"}) == 7
    assert value("torpor_command_bytes_total", {"command": "restore", "kind": "local"}) == 5
    assert value("torpor_command_bytes_total", {"command": "push", "kind": "pushed"}) is None
    assert value("torpor_command_failures_total",
                 {"command": "restore", "error": "IncompatibleNode"}) == 1
    assert value("torpor_command_failures_total", {"command": "restore", "error": "Signal"}) == 1
    assert value("torpor_command_failures_total", {"command": "push", "error": "ExitStatus"}) == 1
    assert value("torpor_command_failures_total", {"command": "checkpoint", "error": ""}) is None


@pytest.mark.parametrize("data", [b"", b"{", b"[1]\n", b'{"bytes": [1], "error": 3}\n',
                                  b'{"bytes":{"local":true}}'])
def test_a_cut_or_garbled_report_counts_nothing(data: bytes) -> None:
    assert tally.parse_report(data) == ({}, "")


def test_a_report_is_one_pipe_write_read_back_whole() -> None:
    read_end, write_end = os.pipe2(os.O_NONBLOCK)
    tally.reset()   # what earlier tests' in-process commands noted
    try:
        assert read_report(read_end) == b""    # a child killed before it wrote
        tally.add("written", 12)
        tally.failed("CheckpointError")
        tally.failed("OSError")                # the first error stands
        os.write(write_end, tally.report())
        assert tally.parse_report(read_report(read_end))[1] == "CheckpointError"
        with pytest.raises(ValueError, match="kind"):
            tally.add("sent", 1)
    finally:
        os.close(read_end)
        os.close(write_end)
        tally.reset()


def test_no_service_runs_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORPOR_NO_SERVICE", "1")
    assert handoff.service_socket() is None
    monkeypatch.delenv("TORPOR_NO_SERVICE")
    monkeypatch.setenv("TORPOR_CONFIG", "/nonexistent/torpor.toml")  # the CLI reports that
    assert handoff.service_socket() is None


def test_nothing_listening_is_one_failed_connect(tmp_path: object) -> None:
    assert handoff.connect(f"{tmp_path}/none.sock") is None
