"""torpor-runc over Debian's runc 1.1.5 and over runc 1.3: what differs between them and reaches
torpor's callers. The core suite (lifecycle, checkpoint and restore, ctr's checkpoints) runs on
both through `pytest --containerd 2 --runc 1.3` (the Makefile's second run); this file holds the
checks that are about the versions themselves.

containerd 2.x's runc shim runs `<BinaryName> features` (no global flags) and parses stdout as
JSON; its CRI plugin decides from it whether user namespaces work. torpor-runc must hand that
over untouched, with nothing of its own on stdout or stderr.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .support import ecosystem

pytestmark = pytest.mark.real


@pytest.mark.parametrize("version", ["1.1", "1.3"])
def test_features_is_runcs_own_answer(torpor_bin: Path, tmp_path: Path, version: str) -> None:
    runc = str(ecosystem.runc_path(version) or "/usr/sbin/runc")
    config = tmp_path / "torpor.toml"
    config.write_text(f'[runtime]\npath = "{runc}"\nstate_dir = "{tmp_path}/state"\n'
                      f'log_dir = "{tmp_path}/state-logs"\n')
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TORPOR_CONFIG": str(config)}
    direct = subprocess.run([runc, "features"], capture_output=True, env=env, timeout=30)
    through = subprocess.run([str(torpor_bin / "torpor-runc"), "features"], capture_output=True,
                             env=env, timeout=30)
    assert through.returncode == direct.returncode == 0
    assert (through.stdout, through.stderr) == (direct.stdout, direct.stderr)
    features = json.loads(through.stdout)
    assert "createRuntime" in features["hooks"]  # where torpor-hook runs on restore
    idmap = features["linux"].get("mountExtensions", {}).get("idmap", {}).get("enabled")
    # what containerd 2.x's CRI plugin reads for user namespaces: only runc 1.2+ says yes
    assert idmap is (True if version == "1.3" else None)
