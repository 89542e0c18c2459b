"""CRIU's options in one shape: CLI flags -> containerd's CheckpointOptions -> the argv containerd's
shim gives torpor-runc -> the options torpor-runc reads back -> the flags a restore repeats."""

from __future__ import annotations

import pytest

from torpor.containerd.runtime import checkpoint_options
from torpor.formats.criu import CriuOptions
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
