"""Real containerd: torpor-runc is invisible for a container's whole life, both ways of choosing it.

The same script runs under bare runc, under `--runc-binary torpor-runc` and under the runtime
name `io.containerd.torpor.v2`; what a ctr user sees must be the same, and only the torpor ones
leave (and then remove) torpor-hook's record of the container.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .support.containerd import Node
from .support.processes import wait_for
from .support.workload import task_status

pytestmark = pytest.mark.real

RUNTIMES = {
    "bare-runc": lambda bin_dir: ["--runtime", "io.containerd.runc.v2"],
    "runc-binary": lambda bin_dir: ["--runtime", "io.containerd.runc.v2", "--runc-binary",
                                    str(bin_dir / "torpor-runc")],
    "shim-name": lambda bin_dir: ["--runtime", "io.containerd.torpor.v2"],
}


def record_path(node: Node, state_dir: Path, name: str) -> Path:
    """The container's record directory under torpor's state dir (keyed by its bundle)."""
    from torpor.capture import records

    bundle = node.root / "state" / "io.containerd.runtime.v2.task" / node.namespace / name
    return Path(records.record_dir(str(state_dir), str(bundle), name))


def transcript(node: Node, runtime: list[str], name: str, image: str) -> dict[str, object]:
    seen: dict[str, object] = {}
    fg = node.ctr("run", "--rm", *runtime, image, f"{name}-fg", "sh", "-c",
                  "echo out; echo err >&2; exit 7", check=False)
    seen["foreground"] = (fg.returncode, fg.stdout, fg.stderr)
    node.ctr("run", "-d", *runtime, image, name, "sh", "-c",
             "trap 'exit 3' TERM; sleep 600 & wait")
    wait_for(lambda: task_status(node, name) == "RUNNING", what="task running")
    ex = node.ctr("tasks", "exec", "--exec-id", "e1", name, "sh", "-c", "echo in; exit 5",
                  check=False)
    seen["exec"] = (ex.returncode, ex.stdout)
    seen["ps_count"] = len(node.ctr("tasks", "ps", name).stdout.splitlines()) - 1
    node.ctr("tasks", "pause", name)
    seen["paused"] = task_status(node, name)
    node.ctr("tasks", "resume", name)
    seen["resumed"] = task_status(node, name)
    node.ctr("tasks", "kill", name)  # SIGTERM: the trap exits 3
    wait_for(lambda: task_status(node, name) == "STOPPED", what="task stopped")
    seen["stopped"] = task_status(node, name)
    node.ctr("tasks", "delete", name)
    seen["deleted"] = task_status(node, name)
    node.ctr("containers", "delete", name)
    seen["containers"] = name in node.ctr("containers", "ls", "-q").stdout.split()
    return seen


def test_lifecycle_is_the_same_as_bare_runc(node: Node, torpor_bin: Path, state_dir: Path,
                                           test_image: dict[str, object]) -> None:
    image = str(test_image["name"])
    results = {label: transcript(node, make(torpor_bin), f"life-{label}", image)
               for label, make in RUNTIMES.items()}
    bare = results.pop("bare-runc")
    assert bare["foreground"] == (7, "out\n", "err\n")
    assert bare["exec"] == (5, "in\n")
    assert (bare["paused"], bare["resumed"], bare["stopped"]) == ("PAUSED", "RUNNING", "STOPPED")
    for label, seen in results.items():
        assert seen == bare, label


@pytest.mark.parametrize("label", ["runc-binary", "shim-name"])
def test_a_container_leaves_nothing_in_the_state_dir(node: Node, torpor_bin: Path,
                                                     state_dir: Path,
                                                     test_image: dict[str, object],
                                                     label: str) -> None:
    name = f"hook-{label}"
    node.ctr("run", "-d", *RUNTIMES[label](torpor_bin), str(test_image["name"]), name,
             "sleep", "600")
    wait_for(lambda: task_status(node, name) == "RUNNING", what="task running")
    node.ctr("tasks", "delete", "--force", name)
    node.ctr("containers", "delete", name)
    assert not record_path(node, state_dir, name).exists()


def test_bare_runc_leaves_no_record(node: Node, state_dir: Path,
                                    test_image: dict[str, object]) -> None:
    node.ctr("run", "--rm", "--runtime", "io.containerd.runc.v2", str(test_image["name"]),
             "bare-norecord", "true")
    assert not record_path(node, state_dir, "bare-norecord").exists()


def test_broken_low_level_runtime_is_explained_to_ctr(node: Node, torpor_bin: Path,
                                                      tmp_path: Path,
                                                      test_image: dict[str, object]) -> None:
    config = tmp_path / "broken.toml"
    config.write_text('[runtime]\npath = "/opt/missing/runc"\n')
    wrapper = tmp_path / "broken-torpor-runc"
    wrapper.write_text(f"#!/bin/sh\nTORPOR_CONFIG={config} exec {torpor_bin}/torpor-runc \"$@\"\n")
    wrapper.chmod(0o755)
    result = node.ctr("run", "--rm", "--runtime", "io.containerd.runc.v2", "--runc-binary",
                      str(wrapper), str(test_image["name"]), "broken-runtime", "true", check=False)
    assert result.returncode != 0
    assert "torpor: low-level runtime /opt/missing/runc does not exist" in result.stderr
    node.ctr("containers", "delete", "broken-runtime", check=False)


def test_cri_plugin_loads_the_runtime_class(nodes: object, torpor_bin: Path) -> None:
    cri = nodes.start("cri", cri=True)  # type: ignore[attr-defined]
    plugins = cri.ctr("plugins", "ls").stdout
    cri_line = next(line for line in plugins.splitlines() if " cri " in f" {line} ")
    assert cri_line.split()[-1] == "ok"
    import subprocess

    dump = subprocess.run(["containerd", "--config", str(cri.config_path), "config", "dump"],
                          capture_output=True, text=True, check=True).stdout
    assert '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.torpor]' in dump
    assert f'BinaryName = "{torpor_bin}/torpor-runc"' in dump
    time.sleep(0)
