"""torpor-hook records a container at createRuntime, removes it at poststop, shrugs at the rest."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


def hook(torpor_bin: Path, state_dir: Path, name: str,
         state: dict | None) -> subprocess.CompletedProcess[str]:
    data = json.dumps(state) if state is not None else ""
    return subprocess.run([torpor_bin / "torpor-hook", "--state-dir", str(state_dir), name],
                          input=data, capture_output=True, text=True)


def test_create_and_poststop(tmp_path: Path, torpor_bin: Path) -> None:
    bundle = tmp_path / "io.containerd.runtime.v2.task" / "ns1" / "c1"
    bundle.mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({
        "mounts": [{"destination": "/data", "source": "/srv/data", "type": "bind"},
                   {"destination": "/dev/nvidia0", "source": "/dev/nvidia0", "type": "bind"}],
        "linux": {"namespaces": [{"type": "network"}, {"type": "pid"}],
                  "devices": [{"path": "/dev/nvidiactl", "type": "c"}]},
    }))
    state = {"ociVersion": "1.0.2", "id": "c1", "pid": os.getpid(), "bundle": str(bundle),
             "status": "creating", "annotations": {"a": "b"}}
    result = hook(torpor_bin, tmp_path / "state", "createRuntime", state)
    assert result.returncode == 0, result.stderr
    record_file = tmp_path / "state" / "containers" / "ns1" / "c1" / "container.json"
    record = json.loads(record_file.read_text())
    assert record["pid"] == os.getpid()
    assert record["netns"] == {"path": f"/proc/{os.getpid()}/ns/net",
                               "inode": os.stat(f"/proc/{os.getpid()}/ns/net").st_ino,
                               "created_by_runtime": True}
    assert record["gpu_devices"] == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert record["annotations"] == {"a": "b"}
    assert hook(torpor_bin, tmp_path / "state", "poststop", state).returncode == 0
    assert not record_file.parent.exists()


def test_unknown_hook_warns_and_succeeds(tmp_path: Path, torpor_bin: Path) -> None:
    result = hook(torpor_bin, tmp_path, "preHibernate", {"id": "x"})
    assert result.returncode == 0
    assert "unknown hook 'preHibernate'" in result.stderr
    assert hook(torpor_bin, tmp_path, "poststart", {"id": "x"}).stderr == ""


def test_garbage_state_does_not_fail_the_container(tmp_path: Path, torpor_bin: Path) -> None:
    result = subprocess.run([torpor_bin / "torpor-hook", "createRuntime"], input="not json",
                            capture_output=True, text=True)
    assert result.returncode == 0
