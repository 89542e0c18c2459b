"""Options that contradict each other are errors before anything starts (issue 24): each
command's combinations, with the message naming both options. containerd's address is a socket
that does not exist, so a command that got past its options would fail another way."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from torpor.cli.main import cli

CONTRADICTIONS = [
    # (argv, words the message must hold)
    (["checkpoint", "web1", "-o", "{tmp}/x", "-t", "reg.example/x:3"], ["-o", "-t", "--oci"]),
    (["checkpoint", "web1", "-o", "{tmp}/x", "-t", "reg.example/x:3", "--push"], ["-o", "-t"]),
    (["checkpoint", "web1", "-o", "{tmp}/x", "--push"], ["--push", "-t REF"]),
    (["checkpoint", "web1", "-t", "reg.example/x:3", "--oci"], ["--oci", "-o DIR"]),
    (["checkpoint", "web1", "-o", "{tmp}/x", "--every", "10m"], ["--every", "-o DIR"]),
    (["checkpoint", "web1", "-t", "reg.example/x:3", "--keep", "2"], ["--keep", "--every"]),
    (["checkpoint", "web1", "-t", "reg.example/x:3", "--older-than", "1h"],
     ["--older-than", "--every"]),
    (["checkpoint", "web1", "-o", "{tmp}/x", "--encrypt-recipient", "jwe:{tmp}/k.pub"],
     ["--encrypt-recipient", "-t REF"]),
    (["checkpoint", "web1", "-t", "reg.example/x:3", "--password-stdin"],
     ["--password-stdin", "--username"]),
    (["import", "web1", "ck1", "-o", "{tmp}/x", "-t", "reg.example/x:3"], ["-o", "-t"]),
    (["import", "web1", "ck1", "-o", "{tmp}/x", "--push"], ["--push", "-t REF"]),
    (["kube", "import", "{tmp}/archive.tar", "-o", "{tmp}/x", "-t", "reg.example/x:3"],
     ["-o", "-t"]),
    (["restore", "reg.example/x:3", "--password-stdin"], ["--password-stdin", "--username"]),
    (["pull", "reg.example/x:3", "--password-stdin"], ["--password-stdin", "--username"]),
    (["prune", "--registry"], ["--registry", "REPOSITORY"]),
    (["prune", "--keep", "1", "--insecure"], ["--insecure", "--registry"]),
    (["prune", "reg.example/x", "--keep", "1", "-u", "alice"], ["--username", "--registry"]),
]


@pytest.mark.parametrize(("argv", "words"), CONTRADICTIONS,
                         ids=[" ".join(a[:1] + [w for w in a if w.startswith("-")])
                              for a, _ in CONTRADICTIONS])
def test_contradictory_options_are_refused_naming_both(argv: list[str], words: list[str],
                                                       tmp_path: Path) -> None:
    (tmp_path / "archive.tar").write_bytes(b"")
    (tmp_path / "k.pub").write_bytes(b"")
    args = [a.format(tmp=tmp_path) for a in argv]
    result = CliRunner().invoke(cli, ["--address", str(tmp_path / "no-containerd.sock"), *args],
                                input="pw\n")
    assert result.exit_code == 2, result.output
    for word in words:
        assert word in result.output, (word, result.output)
    assert not (tmp_path / "x").exists()   # nothing made
