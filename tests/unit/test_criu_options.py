"""CRIU's options in one shape: CLI flags -> containerd's CheckpointOptions -> the argv containerd's
shim gives torpor-runc -> the options torpor-runc reads back -> the flags a restore repeats."""

from __future__ import annotations

from pathlib import Path

import pytest

from torpor import config
from torpor.containerd.runtime import checkpoint_options
from torpor.errors import ConfigError
from torpor.formats.criu import CriuOptions
from torpor.shim import checkpoint_cmd
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


@pytest.mark.parametrize(("configured", "tcp_established", "inherited", "told"), [
    ("auto", False, None, "skip"),               # nothing in repair mode: no lock to pay for
    ("auto", True, None, None),                  # connections held still by CRIU's own
    ("auto", False, "network-lock nftables\n", None),   # the caller's CRIU config decides
    ("auto", False, "--network-lock iptables\n", None),
    ("auto", False, "skip-in-flight\n", "skip"),
    ("iptables", False, None, "iptables"),       # the node's choice, either way
    ("skip", True, None, "skip"),
])
def test_the_network_lock_is_skipped_only_where_nothing_needs_it(
        configured: str, tcp_established: bool, inherited: str | None, told: str | None,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if inherited is None:
        monkeypatch.delenv("CRIU_CONFIG_FILE", raising=False)
    else:
        (tmp_path / "criu.conf").write_text(inherited)
        monkeypatch.setenv("CRIU_CONFIG_FILE", str(tmp_path / "criu.conf"))
    options = CriuOptions(tcp_established=tcp_established)
    assert checkpoint_cmd.network_lock(configured, options) == told


def test_a_network_lock_the_config_does_not_know_is_refused(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[checkpoint]\nnetwork_lock = "off"\n')
    monkeypatch.setenv("TORPOR_CONFIG", str(path))
    with pytest.raises(ConfigError, match=r"\[checkpoint\] network_lock = 'off' is not one of"):
        config.load()
