"""The packaging files in the repository are what `torpor runtime-config` prints."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("command", "path"), [
    (["containerd"], "packaging/containerd/torpor-runtime.toml"),
    (["containerd", "--config-version", "3"], "packaging/containerd/torpor-runtime-v3.toml"),
    (["podman"], "packaging/podman/containers.conf.d/torpor.conf"),
    (["crio"], "packaging/crio/crio.conf.d/10-torpor.conf"),
    (["kubernetes"], "packaging/kubernetes/runtimeclass.yaml"),
])
def test_packaging_files_match_the_cli(torpor_bin: Path, command: list[str], path: str) -> None:
    """The drop-ins shipped in packaging/ are what `torpor runtime-config` prints."""
    binary = [] if command == ["kubernetes"] else ["--binary", "/usr/local/bin/torpor-runc"]
    out = subprocess.run([torpor_bin / "torpor", "runtime-config", *command, *binary],
                         capture_output=True, text=True, check=True).stdout
    assert (REPO / path).read_text() == out
