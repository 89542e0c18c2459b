"""torpor-runc used as runc by an operator (runc's own checkpoint.bats does this): the spec is the
operator's, not a checkpoint's, so what it asks for stays. Its "container specific CRIU config"
case sets org.criu.config in the spec: CRIU reads that file at checkpoint and at restore. torpor-
runc seals the spec's requests at checkpoint time, so the restore on this node accepts the
annotation; the same image directory with the annotation pointed elsewhere is a spec this node
never ran, and its CRIU configuration is refused before CRIU sees it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from .support.images import rootfs_layer
from .support.processes import wait_for

pytestmark = pytest.mark.real


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A busybox bundle."""
    root = tmp_path / "bundle"
    (root / "rootfs").mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(rootfs_layer({}))) as tar:
        tar.extractall(root / "rootfs", filter="tar")
    return root


def runtime(torpor_bin: Path, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    config = tmp_path / "torpor.toml"
    config.write_text(f'[runtime]\nstate_dir = "{tmp_path}/state"\nlog_dir = "{tmp_path}/state-logs"\n'
                      f'[image]\nstore = "{tmp_path}/store"\n')
    env = {**os.environ, "TORPOR_CONFIG": str(config)}
    return [str(torpor_bin / "torpor-runc"), "--root", str(tmp_path / "runc-root")], env


def spec(root: Path, criu_config: Path) -> None:
    (root / "config.json").unlink(missing_ok=True)
    subprocess.run(["runc", "spec", "--bundle", str(root)], check=True)
    document = json.loads((root / "config.json").read_text())
    document["process"].update(terminal=False, args=[
        "sh", "-c", "exec </dev/null >/dev/null 2>&1; i=0; "
                    "while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"])
    document["root"]["readonly"] = False
    document["annotations"] = {"org.criu.config": str(criu_config)}
    (root / "config.json").write_text(json.dumps(document))


def count(root: Path) -> int:
    try:
        return int((root / "rootfs" / "tmp" / "count").read_text() or 0)
    except (OSError, ValueError):
        return 0


def test_an_operators_criu_config_is_kept_and_a_changed_one_refused(
        bundle: Path, torpor_bin: Path, tmp_path: Path) -> None:
    root = bundle
    argv, env = runtime(torpor_bin, tmp_path)
    criu_config = tmp_path / "criu.conf"
    criu_config.write_text("log-file=operators-criu.log\n")  # relative: in the work dir
    spec(root, criu_config)
    name = f"op-{os.getpid()}"
    logs = open(tmp_path / "out", "wb")
    images, work = tmp_path / "images", tmp_path / "work"

    def runc(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*argv, *args], capture_output=True, text=True, env=env,
                                cwd=root, timeout=120)
        assert not check or result.returncode == 0, f"{args}: {result.stderr}"
        return result

    try:
        subprocess.run([*argv, "run", "-d", "--bundle", str(root), name], check=True, env=env,
                       stdin=subprocess.DEVNULL, stdout=logs, stderr=logs, timeout=60)
        wait_for(lambda: count(root) > 5, what="the counter")
        runc("checkpoint", "--image-path", str(images), "--work-path", str(work), name)
        assert (work / "operators-criu.log").exists()   # CRIU read the operator's config
        before = count(root)
        (work / "operators-criu.log").unlink()

        # the same images, the annotation changed: a spec this node never sealed
        evil = tmp_path / "evil.conf"
        evil.write_text(f"action-script {tmp_path}/never.sh\n")
        document = json.loads((root / "config.json").read_text())
        document["annotations"]["org.criu.config"] = str(evil)
        (root / "config.json").write_text(json.dumps(document))
        refused = runc("restore", "-d", "--image-path", str(images), "--work-path", str(work),
                       "--bundle", str(root), name, check=False)
        assert refused.returncode != 0
        assert "annotation org.criu.config" in refused.stderr, refused.stderr
        assert not (work / "operators-criu.log").exists()  # CRIU never ran

        spec(root, criu_config)  # the operator's own spec again
        runc("restore", "-d", "--image-path", str(images), "--work-path", str(work),
             "--bundle", str(root), name)
        assert (work / "operators-criu.log").exists()   # and CRIU read it at restore
        time.sleep(0.5)
        assert count(root) > before   # it counts on from where it was
    finally:
        subprocess.run([*argv, "delete", "--force", name], env=env, capture_output=True)
        logs.close()
