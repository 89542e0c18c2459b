"""The ecosystem's tools that packaging/install-deps.sh builds, working with torpor.

containerd 2.x runs torpor's runtime over Debian's runc and over runc 1.3; crictl and nerdctl talk
to a private containerd 2.x; `torpor runtime-config containerd --install` writes a config
version 3 that containerd 2.x loads with the torpor runtime class.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from .conftest import Nodes, run_torpor
from .support import ecosystem
from .support.containerd import Node
from .support.processes import pids_with_arg, wait_for
from .support.workload import task_status

pytestmark = pytest.mark.real


def run(*cmd: str | Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                            timeout=60)
    assert result.returncode == 0, f"{cmd} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
    return result.stdout


def test_runc_13_and_checkpointctl_run() -> None:
    version = run(ecosystem.tool("runc"), "--version")
    assert re.match(r"runc version 1\.3\.\d+\n", version), version
    assert "libseccomp: 2." in version  # built with the seccomp tag, linked to Debian's library
    help_text = run(ecosystem.tool("checkpointctl"), "--help")
    assert help_text.startswith("checkpointctl is a tool to read and manipulate checkpoint archives")
    assert re.search(r"^  inspect ", help_text, re.M) and re.search(r"^  show ", help_text, re.M)


@pytest.mark.parametrize("runc_version", ["1.1", "1.3"], indirect=True)
@pytest.mark.parametrize("containerd_version", ["2"], indirect=True)
def test_torpor_runtime_on_containerd_2(node: Node, runc_version: str, tmp_path: Path,
                                        test_image: dict[str, object]) -> None:
    assert node.major == 2
    lowlevel = run(node.bin_dir / "torpor-runc", "--version", env=node.env)
    assert lowlevel.startswith(f"runc version {runc_version}.")
    name = f"eco-c2-runc{runc_version}"
    node.ctr("run", "-d", "--runtime", "io.containerd.torpor.v2", str(test_image["name"]), name,
             "sh", "-c", "trap 'exit 3' TERM; sleep 600 & wait")
    wait_for(lambda: task_status(node, name) == "RUNNING", what="task running")
    # the task runs under torpor-runc: torpor can checkpoint it (and it keeps running)
    run_torpor(node, "checkpoint", name, "-o", str(tmp_path / "ck"), "--leave-running")
    assert (tmp_path / "ck" / "criu" / "torpor-state.json").exists()
    assert task_status(node, name) == "RUNNING"
    shims = {os.path.realpath(f"/proc/{pid}/exe") for pid in pids_with_arg(node.address)}
    assert str(ecosystem.CONTAINERD2_BIN.resolve() / "containerd-shim-runc-v2") in shims
    assert node.ctr("tasks", "exec", "--exec-id", "e1", name, "echo", "in").stdout == "in\n"
    node.ctr("tasks", "kill", name)  # SIGTERM: the trap exits 3
    wait_for(lambda: task_status(node, name) == "STOPPED", what="task stopped")
    node.ctr("tasks", "delete", name)
    node.ctr("containers", "delete", name)


def test_crictl_and_nerdctl_talk_to_containerd_2(nodes: Nodes) -> None:
    cri = nodes.start("eco-cri", cri=True, containerd="2")
    crictl: list[str | Path] = [ecosystem.tool("crictl"), "--config", "/dev/null",
              "--runtime-endpoint", f"unix://{cri.address}",
              "--image-endpoint", f"unix://{cri.address}"]
    version = run(*crictl, "version")
    assert re.search(r"RuntimeName:\s+containerd\n", version), version
    assert re.search(r"RuntimeVersion:\s+v?2\.", version), version
    info = run(*crictl, "info")
    assert '"torpor"' in info  # the runtime class from torpor's config version 3
    nerdctl = run(ecosystem.tool("nerdctl"), "--address", cri.address, "--namespace",
                  cri.namespace, "--data-root", str(cri.root / "nerdctl"), "version")
    assert re.search(r"Server:\n containerd:\n  Version:\s+v?2\.", nerdctl), nerdctl


def test_runtime_config_install_gives_containerd_2_a_loadable_version_3(
        tmp_path: Path, torpor_bin: Path) -> None:
    containerd = str(ecosystem.CONTAINERD2_BIN / "containerd")
    defaults = tmp_path / "defaults.toml"
    defaults.write_text(run(containerd, "config", "default"))
    fresh = tmp_path / "fresh.toml"
    torpor = torpor_bin / "torpor"
    run(torpor, "runtime-config", "containerd", "--binary", "/opt/t/torpor-runc", "--install",
        defaults)
    run(torpor, "runtime-config", "containerd", "--binary", "/opt/t/torpor-runc",
        "--config-version", "3", "--install", fresh)
    for path in (defaults, fresh):
        dump = tomllib.loads(run(containerd, "--config", path, "config", "dump"))
        assert dump["version"] == 3
        runtimes = dump["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
        assert runtimes["torpor"]["runtime_type"] == "io.containerd.runc.v2"
        assert runtimes["torpor"]["options"]["BinaryName"] == "/opt/t/torpor-runc"
        assert "runc" in runtimes  # the CRI plugin's default runtime is still there
