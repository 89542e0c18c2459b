"""Shared fixtures: torpor's launchers, a private containerd per session, the test image.

Real components only (containerd, runc, CRIU, docker-registry); the one fake is the GPU driver.
Everything lives under one temporary directory per session and is removed at the end, with
every process the session started ended by pid.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support.containerd import Node
from .support.world import World
from .support.world import world as make_world

REPO = Path(__file__).resolve().parent.parent
IMAGE = "localhost/torpor-test/busybox:1"
REQUIRED = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "criu", "docker-registry",
            "skopeo", "gcc", "ip", "iptables")


def require_real_components() -> None:
    """The real-component tests need root and the tools `make deps` installs; tests/unit needs
    neither, so the check runs with the first fixture that starts anything."""
    if os.geteuid() != 0:
        pytest.exit("torpor's tests start containerd, runc and CRIU: run them as root", 2)
    missing = [tool for tool in REQUIRED if not shutil.which(tool, path=os.environ.get("PATH", "")
                                                             + ":/usr/local/sbin:/usr/sbin")]
    if missing:
        pytest.exit(f"missing {', '.join(missing)}: run `make deps` (packaging/install-deps.sh)", 2)


@pytest.fixture(scope="session")
def world() -> Iterator[World]:
    """The session's world: launchers, config, workloads, the test image, containerd nodes."""
    require_real_components()
    with make_world(IMAGE, prefix="torpor-test-") as w:
        yield w


@pytest.fixture(scope="session")
def session_dir(world: World) -> Path:
    return world.base


@pytest.fixture(scope="session")
def torpor_bin(world: World) -> Path:
    """torpor-runc, torpor-hook, torpor and containerd-shim-torpor-v2 for this checkout."""
    return world.bin


@pytest.fixture(scope="session")
def state_dir(world: World) -> Path:
    return world.state_dir


@pytest.fixture(scope="session")
def torpor_config(world: World) -> Path:
    return world.config


@pytest.fixture(scope="session")
def workloads(world: World) -> dict[str, bytes]:
    return world.workloads


@pytest.fixture(scope="session")
def test_image(world: World) -> dict[str, object]:
    return world.image


class Nodes:
    """The world's containerd nodes, started on demand; all stop with the world."""

    def __init__(self, world: World) -> None:
        self.world = world

    def start(self, name: str, own_netns: bool = False, cri: bool = False,
              config: Path | None = None, extra_env: dict[str, str] | None = None) -> Node:
        return self.world.node(name, own_netns=own_netns, cri=cri, config=config,
                               extra_env=extra_env)


@pytest.fixture(scope="session")
def nodes(world: World) -> Nodes:
    return Nodes(world)


@pytest.fixture(scope="session")
def node(nodes: Nodes) -> Node:
    """The session's main containerd (node A)."""
    return nodes.start("a")


@pytest.fixture
def container_name(request: pytest.FixtureRequest) -> str:
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")
    return name[-40:].strip("-")


def run_torpor(node: Node, *args: str, check: bool = True,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The torpor CLI against `node`, as a user runs it."""
    cmd = [str(node.bin_dir / "torpor"), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, env=node.env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n"
                             f"{result.stdout}{result.stderr}")
    return result
