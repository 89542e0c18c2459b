"""Table tests: how torpor-runc reads runc's argv (it never re-declares runc's flags)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torpor.shim.argv import Invocation
from torpor.shim.main import DISPATCH, subcommand

SHIM = ["torpor-runc", "--root", "/run/containerd/runc/default", "--log",
        "/run/b/log.json", "--log-format", "json"]


@pytest.mark.parametrize(("argv", "command"), [
    (["r", "state", "x"], "state"),
    ([*SHIM, "create", "--bundle", "/b", "id"], "create"),
    (["r", "--root=/x", "--log", "l", "kill", "id", "9"], "kill"),
    (["r", "--debug", "--systemd-cgroup", "--criu", "/usr/sbin/criu", "restore", "id"], "restore"),
    (["r", "--rootless", "true", "ps", "id"], "ps"),
    (["r", "--rootless=auto", "delete", "id"], "delete"),
    (["r", "-log", "l", "-root", "r", "checkpoint", "id"], "checkpoint"),
    (["r", "--", "create", "id"], "create"),
    (["r", "--version"], None),
    (["r"], None),
    (["r", "--log"], None),
])
def test_subcommand(argv: list[str], command: str | None) -> None:
    assert subcommand(argv) == command
    assert Invocation(argv).command == command


def test_restore_as_containerd_sends_it() -> None:
    argv = [*SHIM, "restore", "--image-path", "/tmp/ctrd-checkpoint123", "--work-path",
            "/var/lib/w", "--detach", "--pid-file", "/run/b/init.pid", "--no-pivot",
            "-no-subreaper", "--bundle", "/run/b", "c1"]
    inv = Invocation(argv)
    assert inv.command == "restore"
    assert inv.global_flag("log") == "/run/b/log.json"
    assert inv.global_flag("log-format") == "json"
    assert inv.flag("image-path") == "/tmp/ctrd-checkpoint123"
    assert inv.flag("bundle", "b") == "/run/b"
    assert inv.has("no-subreaper") and inv.has("detach") and inv.has("no-pivot")
    assert inv.container_id == "c1"
    assert not inv.has("tcp-established")


def test_checkpoint_flags_and_equals_forms() -> None:
    inv = Invocation(["r", "checkpoint", "--image-path=/i", "--work-path", "/w",
                      "--tcp-established", "--file-locks=true", "--empty-ns", "network",
                      "--leave-running", "c2"])
    assert inv.flag("image-path") == "/i" and inv.flag("work-path") == "/w"
    assert inv.has("tcp-established") and inv.has("file-locks") and inv.has("leave-running")
    assert inv.values("empty-ns") == ["network"]
    assert inv.container_id == "c2"


def test_create_short_bundle_and_unknown_flags_kept() -> None:
    argv = ["r", "create", "-b", "/bundle", "--future-flag", "--console-socket", "/s", "c3"]
    inv = Invocation(argv)
    assert inv.flag("bundle", "b") == "/bundle"
    assert inv.flag("console-socket") == "/s"
    assert inv.has("future-flag")
    assert inv.container_id == "c3"


def test_with_flags_inserts_after_subcommand_only() -> None:
    argv = [*SHIM, "restore", "--bundle", "/b", "-no-subreaper", "c"]
    out = Invocation(argv).with_flags(["--tcp-established"])
    assert out == [*SHIM, "restore", "--tcp-established", "--bundle", "/b", "-no-subreaper", "c"]


def test_dispatch_table_is_small_and_the_front_end_agrees() -> None:
    assert set(DISPATCH) == {"checkpoint", "restore"}
    source = (Path(__file__).resolve().parents[2] / "torpor" / "shim" / "frontend.c").read_text()
    assert 'INTERCEPTED[] = {"checkpoint", "restore", NULL}' in source


@pytest.mark.parametrize(("argv", "expected"), [
    (["r", "checkpoint", "--image-path", "/tmp/x", "--leave-running", "c"],
     ["r", "checkpoint", "--image-path", "/dir", "--leave-running", "c"]),
    (["r", "--log", "l", "checkpoint", "--image-path=/tmp/x", "c"],
     ["r", "--log", "l", "checkpoint", "--image-path=/dir", "c"]),
    (["r", "checkpoint", "c"], ["r", "checkpoint", "--image-path", "/dir", "c"]),
])
def test_with_flag_value(argv: list[str], expected: list[str]) -> None:
    assert Invocation(argv).with_flag_value("image-path", "/dir") == expected


@pytest.mark.parametrize(("given", "on"), [
    (["--tcp-established"], True), (["--tcp-established=1"], True),
    (["--tcp-established=T"], True), (["--tcp-established=True"], True),
    (["--tcp-established=0"], False), (["--tcp-established=false"], False),
    (["--tcp-established", "--tcp-established=false"], False),   # the last one given wins
    (["--tcp-established=f", "--tcp-established=t"], True),
])
def test_boolean_flags_read_as_runc_reads_them(given: list[str], on: bool) -> None:
    """runc takes `--flag=V` with Go's strconv.ParseBool: whatever it dumps with, torpor-runc
    reads the same (a connection dumped while torpor thought it was not would skip CRIU's
    network lock)."""
    inv = Invocation(["torpor-runc", "checkpoint", *given, "c1"])
    assert inv.has("tcp-established") is on
