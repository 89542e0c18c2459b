"""CRIU's options in one shape: CLI flags -> containerd's CheckpointOptions -> the argv containerd's
shim gives torpor-runc -> the options torpor-runc reads back -> the flags a restore repeats."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from torpor import config
from torpor.containerd.runtime import checkpoint_options
from torpor.errors import ConfigError
from torpor.formats.criu import CriuOptions
from torpor.shim import checkpoint_cmd, tool_answers
from torpor.shim.argv import Invocation
from torpor.shim.criu_flags import criu_options

ALL_ON = CriuOptions(tcp_established=True, file_locks=True, ext_unix_sk=True, shell_job=True,
                     leave_running=True, empty_ns=("network",))


def shim_argv(options: CriuOptions) -> list[str]:
    """What go-runc's CheckpointOpts.args() makes of containerd's CheckpointOptions."""
    proto = checkpoint_options(options, "/img", "/work")
    argv = ["torpor-runc", "--root", "/run/containerd/runc/ns", "--log", "/b/log.json",
            "--log-format", "json", "checkpoint", "--image-path", proto.image_path,
            "--work-path", proto.work_path]
    argv += ["--tcp-established"] * proto.open_tcp + ["--ext-unix-sk"] * \
        proto.external_unix_sockets + ["--shell-job"] * proto.terminal + \
        ["--file-locks"] * proto.file_locks
    for ns in proto.empty_namespaces:
        argv += ["--empty-ns", ns]
    argv += [] if proto.exit else ["--leave-running"]
    return [*argv, "c1"]


@pytest.mark.parametrize("options", [CriuOptions(), ALL_ON,
                                     CriuOptions(tcp_established=True),
                                     CriuOptions(leave_running=True, file_locks=True)])
def test_options_survive_the_trip_through_containerd_and_runc(options: CriuOptions) -> None:
    assert criu_options(Invocation(shim_argv(options))) == options


def test_containerd_options_mean_what_they_say() -> None:
    proto = checkpoint_options(CriuOptions(leave_running=False, tcp_established=True))
    assert proto.exit and proto.open_tcp and not proto.file_locks
    assert not checkpoint_options(ALL_ON).exit


def test_restore_repeats_what_the_dump_needs() -> None:
    assert ALL_ON.restore_flags() == ["--tcp-established", "--file-locks", "--ext-unix-sk",
                                      "--shell-job"]
    assert CriuOptions(leave_running=True).restore_flags() == []
    assert ALL_ON.enabled()[-1] == "leave-running"


@pytest.mark.parametrize(("configured", "tcp_established", "skip_in_flight", "named", "told"), [
    ("auto", False, True, None, "skip"),         # nothing in repair mode: no lock to pay for
    ("auto", True, True, None, None),            # connections held still by CRIU's own
    ("auto", False, False, None, None),          # a client of the frozen workload would fail it
    ("auto", False, True, "network-lock nftables\n", None),   # a CRIU config decides
    ("auto", False, True, "--network-lock=iptables\n", None),
    ("auto", False, True, "network-lock=nftables # the admin's\n", None),
    ("auto", False, True, "tcp-established\n", None),      # connections behind runc's back
    ("auto", False, True, "  --tcp-established\n", None),
    ("auto", False, True, "# network-lock iptables\nskip-in-flight\n", "skip"),
    ("iptables", False, True, None, "iptables"),  # the node's choice, either way
    ("skip", True, True, None, "skip"),
])
def test_the_network_lock_is_skipped_only_where_nothing_needs_it(
        configured: str, tcp_established: bool, skip_in_flight: bool, named: str | None,
        told: str | None, tmp_path: Path) -> None:
    configs = [str(tmp_path / "absent.conf")]
    if named is not None:
        (tmp_path / "criu.conf").write_text(named)
        configs.append(str(tmp_path / "criu.conf"))
    options = CriuOptions(tcp_established=tcp_established)
    assert checkpoint_cmd.network_lock(configured, options, skip_in_flight, configs) == told


def test_every_criu_config_criu_reads_is_looked_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """CRIU reads its global and user defaults, CRIU_CONFIG_FILE, and the file runc names (the
    container's org.criu.config, else /etc/criu/runc.conf) for runc's dump."""
    monkeypatch.setenv("HOME", "/home/op")
    monkeypatch.setenv("CRIU_CONFIG_FILE", "/tmp/env.conf")
    base = ["/etc/criu/default.conf", "/home/op/.criu/default.conf", "/tmp/env.conf"]
    assert checkpoint_cmd.criu_configs({}) == [*base, "/etc/criu/runc.conf"]
    named = {"annotations": {"org.criu.config": "/etc/ours.conf"}}
    assert checkpoint_cmd.criu_configs(named) == [*base, "/etc/ours.conf"]
    assert checkpoint_cmd.criu_configs({"annotations": {"org.criu.config": ""}}) == base


def test_criu_versions_are_asked_once_per_binary(tmp_path: Path) -> None:
    """`criu --version` once; asked again when the binary is another one."""
    criu, calls = tmp_path / "criu", tmp_path / "calls"
    criu.write_text(f'#!/bin/sh\necho x >> {calls}\necho "Version: 3.18"\n')
    criu.chmod(0o755)
    state = str(tmp_path / "state")
    assert tool_answers.criu_version(str(criu), state) == (3, 18)
    assert tool_answers.criu_version(str(criu), state) == (3, 18)
    assert calls.read_text().count("x") == 1
    criu.write_text(f'#!/bin/sh\necho x >> {calls}\necho "Version: 4.2.1"\n')
    assert tool_answers.criu_version(str(criu), state) == (4, 2, 1)
    assert calls.read_text().count("x") == 2
    assert tool_answers.criu_version(str(tmp_path / "none"), state) == ()


def test_runc_is_asked_for_its_flags_once_per_binary(tmp_path: Path) -> None:
    runc, calls = tmp_path / "runc", tmp_path / "calls"
    runc.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                    'echo "   runc checkpoint - checkpoint a running container"\n'
                    'echo "   --tcp-skip-in-flight  skip"\n')
    runc.chmod(0o755)
    state = str(tmp_path / "state")
    for _ in range(3):
        assert tool_answers.takes_flag(str(runc), "checkpoint", "tcp-skip-in-flight", state)
        assert not tool_answers.takes_flag(str(runc), "checkpoint", "no-such-flag", state)
    assert calls.read_text().splitlines() == ["checkpoint --help"] * 2   # one per question
    assert tool_answers.criu_version(str(runc), state) == ()   # not CRIU: nothing remembered
    assert not tool_answers.takes_flag(str(tmp_path / "gone"), "checkpoint", "x", state)
    assert not tool_answers.takes_flag("no-such-runc-on-path", "checkpoint", "x", state)


def test_an_answer_runc_could_not_give_is_not_remembered(tmp_path: Path) -> None:
    """A runc killed or failing while it prints its help says nothing about its flags: asked
    again next time (a remembered "no" would drop --tcp-skip-in-flight for good)."""
    runc, calls = tmp_path / "runc", tmp_path / "calls"
    runc.write_text(f'#!/bin/sh\necho x >> {calls}\necho "--tcp-skip-in-flight"\nexit 137\n')
    runc.chmod(0o755)
    state = str(tmp_path / "state")
    for _ in range(2):
        assert not tool_answers.takes_flag(str(runc), "checkpoint", "tcp-skip-in-flight", state)
    assert calls.read_text().count("x") == 2


def answered_criu(tmp_path: Path) -> tuple[Path, Path]:
    """A CRIU 4.2.1 whose version is already remembered in a state directory of root's."""
    criu = tmp_path / "criu"
    criu.write_text('#!/bin/sh\necho "Version: 4.2.1"\n')
    criu.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    assert tool_answers.criu_version(str(criu), str(state)) == (4, 2, 1)
    return criu, state


@pytest.mark.parametrize("planted", ['{"criu --version": {"binary": BIN, "answer": ["4", "0"]}}',
                                     '{"criu --version": {"binary": BIN, "answer": [[3]]}}',
                                     "[" * 100000 + "]" * 100000, "not json", "[]"])
def test_a_damaged_answers_file_is_asked_past(planted: str, tmp_path: Path) -> None:
    criu, state = answered_criu(tmp_path)
    binary = json.loads((state / tool_answers.CACHE).read_text())["criu --version"]["binary"]
    (state / tool_answers.CACHE).write_text(planted.replace("BIN", json.dumps(binary)))
    assert tool_answers.criu_version(str(criu), str(state)) == (4, 2, 1)


def test_answers_others_could_write_are_not_trusted(tmp_path: Path) -> None:
    criu, state = answered_criu(tmp_path)
    cache = state / tool_answers.CACHE
    known = json.loads(cache.read_text())
    known["criu --version"]["answer"] = [3, 18]   # planted
    cache.write_text(json.dumps(known))
    cache.chmod(0o666)
    assert tool_answers.criu_version(str(criu), str(state)) == (4, 2, 1)
    cache.chmod(0o600)
    state.chmod(0o777)   # a directory others may write into: nothing in it is believed
    assert tool_answers.criu_version(str(criu), str(state)) == (4, 2, 1)


def test_a_criu_config_that_is_no_regular_file_is_not_read(tmp_path: Path) -> None:
    """The container's org.criu.config names the path: a FIFO there (nobody writing) must not
    hold torpor-runc up."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    options = CriuOptions()
    assert checkpoint_cmd.network_lock("auto", options, True, [str(fifo), "/dev/zero"]) == "skip"


def test_a_network_lock_the_config_does_not_know_is_refused(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[checkpoint]\nnetwork_lock = "off"\n')
    monkeypatch.setenv("TORPOR_CONFIG", str(path))
    with pytest.raises(ConfigError, match=r"\[checkpoint\] network_lock = 'off' is not one of"):
        config.load()
