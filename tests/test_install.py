"""`make install PREFIX=DIR` (packaging/install.sh) keeps to its prefix: the environment, the
launchers and the configuration all under DIR, nothing in /etc/torpor or /opt/torpor, and the
prefix's launchers (the Python ones and torpor-runc's compiled front end) read the prefix's
configuration. A real install: pip, the C compiler, the pycriu `make deps` built."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.real
INSTALLER = Path(__file__).resolve().parents[1] / "packaging" / "install.sh"


def listing(path: Path) -> list[tuple[str, int]] | None:
    """What is in `path` (names and modification times), None when it does not exist."""
    if not path.exists():
        return None
    return sorted((str(p), p.stat().st_mtime_ns) for p in [path, *path.rglob("*")])


def test_a_prefix_install_writes_only_under_its_prefix(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    outside = {p: listing(p) for p in (Path("/etc/torpor"), Path("/opt/torpor"))}
    env = {k: v for k, v in os.environ.items() if k not in ("TORPOR_CONFIG", "TORPOR_HOME")}
    result = subprocess.run(["bash", str(INSTALLER)], env={**env, "PREFIX": str(prefix)},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert {p: listing(p) for p in outside} == outside, "wrote outside the prefix"
    config = prefix / "etc" / "torpor" / "config.toml"
    assert config.is_file() and (prefix / "lib" / "torpor" / "venv" / "bin" / "python").exists()
    assert f"wrote {config}" in result.stderr
    for name in ("torpor", "torpor-runc", "torpor-hook", "containerd-shim-torpor-v2"):
        assert (prefix / "bin" / name).is_file(), name

    # the front end runs the [runtime] path of the prefix's configuration for what it passes on
    runtime = tmp_path / "fake-runc"
    runtime.write_text("#!/bin/sh\necho \"the prefix's runtime: $*\"\n")
    runtime.chmod(0o755)
    config.write_text(f'[runtime]\npath = "{runtime}"\n')
    ran = subprocess.run([str(prefix / "bin" / "torpor-runc"), "state", "x"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert ran.stdout.strip() == "the prefix's runtime: state x", (ran.stdout, ran.stderr)
    # and so does the CLI: a broken file there is the one it names
    config.write_text("[runtime\n")
    listed = subprocess.run([str(prefix / "bin" / "torpor"), "ls"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode != 0 and str(config) in listed.stderr, listed.stderr
