"""Restore on create, the pure parts: the runnable image's mark, the spec check, the argv that
turns the shim's `create` into `runc restore`, and the names the front end shares."""

from __future__ import annotations

import re
from pathlib import Path

from torpor.formats import names
from torpor.image import documents
from torpor.shim import create_cmd, on_create_check
from torpor.shim.argv import Invocation

MARK = "TORPOR_CHECKPOINT=torpor.checkpoint.v1"


def test_the_runnable_config_carries_the_mark_once_and_its_base_does_not() -> None:
    base = {"config": {"Env": ["PATH=/bin", "TORPOR_CHECKPOINT=old"], "Cmd": ["sh"]},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:a"]}}
    config = documents.runnable_config(base, "sha256:b", "2026-01-01T00:00:00Z", "c1")
    assert config["config"]["Env"] == ["PATH=/bin", MARK]
    assert config["config"]["Cmd"] == ["sh"]
    again = documents.runnable_config(documents.without_rw_layer(config), "sha256:c",
                                      "2026-01-01T00:00:00Z", "c1")
    assert again["config"]["Env"] == ["PATH=/bin", MARK]
    assert documents.without_rw_layer(config)["config"]["Env"] == ["PATH=/bin"]
    bare = documents.runnable_config({}, None, "2026-01-01T00:00:00Z", "c1")
    assert bare["config"]["Env"] == [MARK]


def test_a_marked_spec_restores_unless_it_asks_to_start_cold() -> None:
    marked = {"process": {"env": ["PATH=/bin", MARK]}}
    assert create_cmd.wants_restore(marked)
    assert not create_cmd.wants_restore({"process": {"env": ["PATH=/bin"]}})
    assert not create_cmd.wants_restore({"process": {"env": ["X=TORPOR_CHECKPOINT=1"]}})
    assert not create_cmd.wants_restore({**marked, "annotations": {
        "io.torpor.restore.cold-start": "True"}})
    assert create_cmd.wants_restore({**marked, "annotations": {
        "io.torpor.restore.cold-start": "false"}})


def test_create_becomes_a_detached_restore_with_the_shims_bundle_pid_file_and_console() -> None:
    inv = Invocation(["torpor-runc", "--root", "/run/containerd/runc/ns", "--log", "/b/log.json",
                      "--log-format", "json", "create", "--bundle", "/b", "--pid-file",
                      "/b/init.pid", "--console-socket", "/tmp/pty/s", "--no-pivot",
                      "--no-new-keyring", "c1"])
    argv = create_cmd.restore_argv(inv, "/b", "/ck/criu", "/w")
    assert argv == ["torpor-runc", "--root", "/run/containerd/runc/ns", "--log", "/b/log.json",
                    "--log-format", "json", "restore", "--image-path", "/ck/criu",
                    "--work-path", "/w", "--detach", "--no-subreaper", "--pid-file",
                    "/b/init.pid", "--console-socket", "/tmp/pty/s", "--no-pivot",
                    "--bundle", "/b", "c1"]
    plain = Invocation(["torpor-runc", "create", "-b", "/b", "c2"])
    assert create_cmd.restore_argv(plain, "/b", "/i", "/w")[-3:] == ["--bundle", "/b", "c2"]


def test_the_restored_mark_lives_in_runcs_state_directory_of_the_container() -> None:
    assert on_create_check.restored_mark(Invocation(["r", "--root=/r", "start", "c1"])) == \
        "/r/c1/torpor-restored-on-create"
    assert on_create_check.restored_mark(Invocation(["r", "start", "c1"])) == \
        "/run/runc/c1/torpor-restored-on-create"
    assert on_create_check.restored_mark(Invocation(["r", "start", "../x"])) is None


def test_the_fast_checks_and_the_front_end_use_torpors_names() -> None:
    assert on_create_check.CHECKPOINT_ENV == names.CHECKPOINT_ENV
    assert on_create_check.RESTORED_MARK == names.RESTORED_ON_CREATE
    assert documents.CHECKPOINT_MARK.startswith(names.CHECKPOINT_ENV + "=")
    frontend = (Path(create_cmd.__file__).parent / "frontend.c").read_text()
    defined = dict(re.findall(r'#define (SPEC_MARK|RESTORED_MARK|RUNC_ROOT) (".*")', frontend))
    assert defined == {"SPEC_MARK": '"\\"TORPOR_CHECKPOINT="',
                       "RESTORED_MARK": '"torpor-restored-on-create"', "RUNC_ROOT": '"/run/runc"'}
    assert on_create_check.RUNC_ROOT == "/run/runc"


def test_containerd_is_found_where_it_tells_its_shims() -> None:
    import pytest

    from torpor.errors import RestoreError
    from torpor.ops.on_create import containerd_address

    assert containerd_address({"GRPC_ADDRESS": "/run/c.sock",
                               "TTRPC_ADDRESS": "/run/x.sock.ttrpc"}) == "/run/c.sock"
    assert containerd_address({"TTRPC_ADDRESS": "/run/containerd/containerd.sock.ttrpc"}) == \
        "/run/containerd/containerd.sock"
    with pytest.raises(RestoreError, match="works under containerd only"):
        containerd_address({})
