"""The node installer's settings file (packaging/kubernetes/node-env.sh): KEY=value taken
literally, and only from a plain file of root's that no one else writes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "packaging" / "kubernetes" / "node-env.sh"


def read(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", f'. "{SCRIPT}"; read_node_env "$1" && env', "sh",
                           str(path)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})


def test_values_are_taken_literally(tmp_path: Path) -> None:
    settings = tmp_path / "node.env"
    settings.write_text("# k3s\nCONTAINERD_CONFIG=/var/lib/rancher/k3s/c.toml\n\n"
                        "TORPOR_X=a $(id) `id` $HOME b=c\n")
    settings.chmod(0o644)
    done = read(settings)
    assert done.returncode == 0, done.stderr
    assert "CONTAINERD_CONFIG=/var/lib/rancher/k3s/c.toml\n" in done.stdout
    assert "TORPOR_X=a $(id) `id` $HOME b=c\n" in done.stdout


@pytest.mark.parametrize("text, mode, said", [
    ("A=1\n", 0o666, "written by no one else"),
    ("A=1\n", 0o620, "written by no one else"),
    ("export A=1\n", 0o644, "not KEY=value"),
    ("a=1\n", 0o644, "not KEY=value"),
    ("JUST_A_WORD\n", 0o644, "not KEY=value"),
])
def test_what_is_not_read(tmp_path: Path, text: str, mode: int, said: str) -> None:
    settings = tmp_path / "node.env"
    settings.write_text(text)
    settings.chmod(mode)
    done = read(settings)
    assert done.returncode != 0 and said in done.stderr, done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the file must be root's")
def test_a_link_is_not_followed_and_a_missing_file_is_no_settings(tmp_path: Path) -> None:
    real = tmp_path / "real.env"
    real.write_text("A=1\n")
    (tmp_path / "link.env").symlink_to(real)
    done = read(tmp_path / "link.env")
    assert done.returncode != 0 and "not a plain file" in done.stderr
    assert read(tmp_path / "missing.env").returncode == 0
