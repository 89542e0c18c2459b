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

pytestmark = pytest.mark.real
STAMP = re.compile(rb'time="[^"]*"|"time":"[^"]*"')


def both(torpor_bin: Path, tmp_path: Path, *args: str) -> dict[str, tuple[int, bytes, bytes]]:
    """(exit status, stdout, stderr) of bare runc and of torpor-runc, timestamps blanked."""
    runc = shutil.which("runc", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin")
    assert runc is not None
    config = tmp_path / "torpor.toml"
    config.write_text(f'[runtime]\npath = "{runc}"\nstate_dir = "{tmp_path}/state"\n')
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
