"""torpor-hook: applies a restore's network plan at createRuntime, removes the container's record
directory at poststop, shrugs at the rest."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


def hook(torpor_bin: Path, state_dir: Path, name: str,
         state: dict | None) -> subprocess.CompletedProcess[str]:  # type: ignore[type-arg]
    data = json.dumps(state) if state is not None else ""
    return subprocess.run([torpor_bin / "torpor-hook", "--state-dir", str(state_dir), name],
                          input=data, capture_output=True, text=True)


def test_create_runtime_applies_the_plan_and_poststop_cleans_up(tmp_path: Path,
                                                                torpor_bin: Path) -> None:
    bundle = tmp_path / "io.containerd.runtime.v2.task" / "ns1" / "c1"
    bundle.mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"linux": {"namespaces": [{"type": "network"}]}}))
    state = {"ociVersion": "1.0.2", "id": "c1", "pid": os.getpid(), "bundle": str(bundle),
             "status": "creating"}
    from torpor.capture import records

    record = Path(records.record_dir(str(tmp_path / "state"), str(bundle), "c1"))
    assert hook(torpor_bin, tmp_path / "state", "createRuntime", state).returncode == 0
    assert not record.exists()  # an ordinary create writes nothing
    record.mkdir(parents=True)
    plan = record / "restore-net.json"  # what torpor-runc restore leaves: lo up (it is, here)
    plan.write_text(json.dumps({"up": ["lo"], "addresses": [], "routes": []}))
    result = hook(torpor_bin, tmp_path / "state", "createRuntime", state)
    assert result.returncode == 0, result.stderr
    assert not plan.exists()  # applied once, then gone
    assert hook(torpor_bin, tmp_path / "state", "poststop", state).returncode == 0
    assert not record.exists() and not record.parent.exists()


def test_unknown_hook_warns_and_succeeds(tmp_path: Path, torpor_bin: Path) -> None:
    result = hook(torpor_bin, tmp_path, "preHibernate", {"id": "x"})
    assert result.returncode == 0
    assert "unknown hook 'preHibernate'" in result.stderr
    assert hook(torpor_bin, tmp_path, "poststart", {"id": "x"}).stderr == ""


def test_garbage_state_does_not_fail_the_container(tmp_path: Path, torpor_bin: Path) -> None:
    result = subprocess.run([torpor_bin / "torpor-hook", "createRuntime"], input="not json",
                            capture_output=True, text=True)
    assert result.returncode == 0
