"""torpor-runc answers like runc where runc answers: help for every subcommand (torpor would want
a bundle first), and runc's own errors, verbatim, on stderr and in --log. runc's own test
suite matches these texts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import Nodes, run_torpor
from .support.containerd import Node
from .support.workload import COUNTER, containers, task_status, wait_counter_above

pytestmark = pytest.mark.real
STAMP = re.compile(rb'time="[^"]*"|"time":"[^"]*"')


def both(torpor_bin: Path, tmp_path: Path, *args: str) -> dict[str, tuple[int, bytes, bytes]]:
    """(exit status, stdout, stderr) of bare runc and of torpor-runc, timestamps blanked."""
    runc = shutil.which("runc", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin")
    assert runc is not None
    config = tmp_path / "torpor.toml"
    config.write_text(f'[runtime]\npath = "{runc}"\nstate_dir = "{tmp_path}/state"\n'
                      f'log_dir = "{tmp_path}/state-logs"\n')
    out = {}
    for label, binary in (("runc", runc), ("torpor-runc", str(torpor_bin / "torpor-runc"))):
        log = tmp_path / f"{label}.log"
        argv = [a.replace("LOG", str(log)) for a in args]
        result = subprocess.run([binary, "--root", str(tmp_path / "root"), *argv], cwd=tmp_path,
                                capture_output=True, env={"PATH": "/usr/bin:/bin",
                                                          "TORPOR_CONFIG": str(config)})
        logged = log.read_bytes() if log.exists() else b""
        out[label] = (result.returncode, STAMP.sub(b"T", result.stdout),
                      STAMP.sub(b"T", result.stderr + logged))
    return out


@pytest.mark.parametrize("args", [["run", "-h"], ["create", "--help"], ["checkpoint", "-h"],
                                  ["restore", "--help"], ["run", "--bundle", "/nowhere", "-h"]])
def test_help_of_every_subcommand_is_runcs(torpor_bin: Path, tmp_path: Path,
                                           args: list[str]) -> None:
    seen = both(torpor_bin, tmp_path, *args)
    assert seen["torpor-runc"] == seen["runc"]
    assert seen["runc"][0] == 0 and b"USAGE" in seen["runc"][1].upper()


def test_runcs_error_for_a_missing_container_is_verbatim(torpor_bin: Path,
                                                         tmp_path: Path) -> None:
    for args in (["checkpoint", "nosuch"],
                 ["--log", "LOG", "--log-format", "json", "checkpoint", "nosuch"]):
        seen = both(torpor_bin, tmp_path, *args)
        assert seen["torpor-runc"] == seen["runc"]
        assert b"container does not exist" in seen["runc"][2]
    logged = (tmp_path / "torpor-runc.log").read_text().splitlines()
    assert json.loads(logged[-1])["msg"] == "container does not exist"


def test_runcs_own_error_reaches_the_user_when_criu_is_missing(
        nodes: Nodes, node: Node, torpor_bin: Path, tmp_path: Path,
        test_image: dict[str, object]) -> None:
    """runc's fatal error (here: no CRIU on the shim's PATH) is the reason torpor gives, not a
    bare 'runc checkpoint failed (exit 1)': containerd shows torpor's line, which would hide it.
    The workload runs on; a restore there fails naming CRIU's absence, and leaves nothing."""
    path = ":".join([str(node.bin_dir), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
    if shutil.which("criu", path=path):
        pytest.skip("CRIU is installed in /usr/sbin or /usr/bin here: it cannot be hidden")
    bare = nodes.start("no-criu", extra_env={"PATH": path})
    with containers(bare) as names:
        names.append("kept")
        bare.ctr("run", "-d", "--runtime", "io.containerd.torpor.v2", str(test_image["name"]),
                 "kept", "sh", "-c", COUNTER)
        before = wait_counter_above(bare, "kept", 3)
        failed = run_torpor(bare, "checkpoint", "kept", "-o", str(tmp_path / "none"), check=False)
        assert failed.returncode != 0
        assert 'exec: "criu": executable file not found in $PATH' in failed.stderr, failed.stderr
        assert task_status(bare, "kept") == "RUNNING"
        wait_counter_above(bare, "kept", before + 3)

    with containers(node) as names:  # a checkpoint made where CRIU is, restored where it is not
        names.append("moved")
        node.ctr("run", "-d", "--runtime", "io.containerd.torpor.v2", str(test_image["name"]),
                 "moved", "sh", "-c", COUNTER)
        wait_counter_above(node, "moved", 3)
        run_torpor(node, "checkpoint", "moved", "-o", str(tmp_path / "ck"), "--leave-running")
    refused = run_torpor(bare, "restore", str(tmp_path / "ck"), "--name", "moved-b", check=False)
    assert refused.returncode != 0
    # Either the node check finds no CRIU and refuses before containerd is touched, or (it
    # also looks in /usr/local/sbin, which the shim's PATH here lacks) runc restore fails and
    # its own words are the reason: never a bare "runc restore failed (exit 1)".
    assert ("criu: this node has none that runs (no criu on PATH?), the checkpoint needs"
            in refused.stderr or 'runc restore failed (exit 1): CRIU version check failed: exec: '
            '"criu": executable file not found in $PATH' in refused.stderr), refused.stderr
    assert "moved-b" not in bare.ctr("containers", "ls", "-q").stdout.split()
