"""nerdctl's containers as torpor reads them (torpor.containerd.nerdctl), and the restore-time
check that leaves a new namespace's addresses to the spec's other hooks (nerdctl's CNI hook)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torpor.containerd import nerdctl
from torpor.shim.modifiers import HOOK_MARKER
from torpor.shim.restore_cmd import others_set_up_namespaces

NERDCTL = "/usr/local/bin/nerdctl"


def nerdctl_hook(stage: str) -> dict[str, Any]:
    """As `nerdctl run` writes them (2.3): its whole environment comes along."""
    return {"path": NERDCTL, "args": [NERDCTL, "--address=/run/containerd/containerd.sock",
                                      "--data-root=/var/lib/nerdctl", "--namespace=default",
                                      "internal", "oci-hook", stage],
            "env": ["PATH=/usr/bin", "AWS_SECRET_ACCESS_KEY=from-the-shell"]}


def torpor_hook(stage: str) -> dict[str, Any]:
    return {"path": "/usr/local/bin/torpor-hook",
            "args": [HOOK_MARKER, "--state-dir", "/run/torpor", stage]}


def test_checkpoint_path_is_a_path_or_a_name_in_nerdctls_directory() -> None:
    assert nerdctl.checkpoint_path("ck1") == "/var/lib/nerdctl/checkpoints/ck1"
    assert nerdctl.checkpoint_path("ck1", data_root="/srv/n") == "/srv/n/checkpoints/ck1"
    assert nerdctl.checkpoint_path("ck1", "/ckpts", "/srv/n") == "/ckpts/ck1"
    assert nerdctl.checkpoint_path("/abs/ck1", "/ckpts") == "/abs/ck1"
    assert nerdctl.checkpoint_path("./ck1") == os.path.abspath("ck1")


def test_only_nerdctls_own_hooks_are_dropped() -> None:
    other = {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]}
    spec = {"ociVersion": "1.2.0", "x-unknown": [1],
            "hooks": {"createRuntime": [nerdctl_hook("createRuntime"), torpor_hook("x")],
                      "poststop": [nerdctl_hook("postStop")], "prestart": [other]}}
    portable, dropped = nerdctl.without_nerdctl_hooks(spec)
    assert dropped == 2
    assert portable == {"ociVersion": "1.2.0", "x-unknown": [1],
                        "hooks": {"createRuntime": [torpor_hook("x")], "prestart": [other]}}
    assert len(spec["hooks"]["createRuntime"]) == 2  # the container's own spec is not changed
    alone, dropped = nerdctl.without_nerdctl_hooks({"hooks": {"poststop": [
        nerdctl_hook("postStop")]}})
    assert (alone, dropped) == ({}, 1)
    assert not nerdctl.is_nerdctl_hook({"path": NERDCTL, "args": [NERDCTL, "ps"]})
    assert not nerdctl.is_nerdctl_hook({"path": "/bin/sh", "args": ["sh", "internal",
                                                                    "oci-hook"]})


def test_engine_files_are_the_bind_mounted_files_nerdctl_made(tmp_path: Path) -> None:
    for name in ("hosts", "resolv.conf", "hostname"):
        (tmp_path / name).write_text(name)
    (tmp_path / "dir").mkdir()
    spec = {"mounts": [
        {"destination": "/etc/resolv.conf", "type": "bind", "source": str(tmp_path / "resolv.conf"),
         "options": ["bind", "rprivate"]},
        {"destination": "/etc/hosts", "type": "bind", "source": str(tmp_path / "hosts"),
         "options": ["rbind", "ro"]},
        {"destination": "/etc/hostname", "type": "none", "source": str(tmp_path / "hostname"),
         "options": ["rbind"]},
        {"destination": "/data", "type": "bind", "source": str(tmp_path / "dir"),
         "options": ["rbind"]},
        {"destination": "/etc/missing", "type": "bind", "source": str(tmp_path / "gone")},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": []},
    ]}
    assert nerdctl.engine_files(spec) == [
        nerdctl.EngineFile("/etc/resolv.conf", str(tmp_path / "resolv.conf"), False),
        nerdctl.EngineFile("/etc/hosts", str(tmp_path / "hosts"), True),
        nerdctl.EngineFile("/etc/hostname", str(tmp_path / "hostname"), False),
    ]
    (tmp_path / "hosts").unlink()
    assert [f.destination for f in nerdctl.engine_files(spec)] == ["/etc/resolv.conf",
                                                                   "/etc/hostname"]


def test_other_setup_hooks_may_give_a_new_namespace_its_addresses() -> None:
    assert not others_set_up_namespaces({})
    assert not others_set_up_namespaces({"hooks": {"createRuntime": [torpor_hook("c")],
                                                   "poststop": [nerdctl_hook("postStop")]}})
    assert others_set_up_namespaces({"hooks": {"createRuntime": [
        nerdctl_hook("createRuntime"), torpor_hook("c")]}})
    assert others_set_up_namespaces({"hooks": {"prestart": [{"path": "/cni-hook"}]}})
