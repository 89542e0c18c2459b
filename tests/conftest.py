"""Shared fixtures: torpor's launchers, a private containerd per session, the test image.

Real components only (containerd, runc, CRIU, docker-registry); the one fake is the GPU driver.
Everything lives under one temporary directory per session and is removed at the end, with
every process the session started ended by pid.

Versions: `node` runs Debian's containerd 1.6 and runc 1.1.5 unless asked otherwise. A test asks
for others by parametrizing the fixtures `containerd_version` ("1.6", "2", "2.4") and `runc_version`
("1.1", "1.3") indirectly, e.g.

    @pytest.mark.parametrize("containerd_version", ["1.6", "2"], indirect=True)
    def test_x(node: Node) -> None: ...

and the whole suite runs on others with `pytest --containerd 2 --runc 1.3`. Extra nodes take the
same words: `nodes.start("b", containerd="2", runc="1.3")`. containerd 2.x, runc 1.3, nerdctl,
crictl and checkpointctl come from packaging/install-deps.sh (tests/support/ecosystem.py).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import ecosystem
from .support.containerd import Node
from .support.world import World
from .support.world import world as make_world

REPO = Path(__file__).resolve().parent.parent
IMAGE = "localhost/torpor-test/busybox:1"
REQUIRED = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "criu", "docker-registry",
            "skopeo", "gcc", "ip", "iptables", "podman")


def require_real_components() -> None:
    """The real-component tests need root and the tools `make deps` installs; tests/unit needs
    neither, so the check runs with the first fixture that starts anything."""
    if os.geteuid() != 0:
        pytest.exit("torpor's tests start containerd, runc and CRIU: run them as root", 2)
    missing = [tool for tool in REQUIRED if not ecosystem.which(tool)]
    missing += ecosystem.missing()
    if missing:
        pytest.exit(f"missing {', '.join(missing)}: run `make deps` (packaging/install-deps.sh)", 2)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--containerd", default="1.6", choices=ecosystem.CONTAINERD_VERSIONS,
                     help="containerd of the `node` fixture unless a test asks (default 1.6)")
    parser.addoption("--runc", default="1.1", choices=ecosystem.RUNC_VERSIONS,
                     help="torpor-runc's low-level runc unless a test asks (default 1.1)")


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
        self.shared: dict[tuple[str, str], Node] = {}

    def start(self, name: str, own_netns: bool = False, cri: bool = False,
              config: Path | None = None, extra_env: dict[str, str] | None = None,
              containerd: str = "1.6", runc: str = "1.1", torpor_runtime: bool = True) -> Node:
        return self.world.node(name, own_netns=own_netns, cri=cri, config=config,
                               extra_env=extra_env, containerd=containerd, runc=runc,
                               torpor_runtime=torpor_runtime)

    def main_node(self, containerd: str, runc: str) -> Node:
        """The session's node A for these versions, started on first use."""
        key = (containerd, runc)
        if key not in self.shared:
            suffix = "".join(f"-{what}{version}" for what, version, default
                             in (("containerd", containerd, "1.6"), ("runc", runc, "1.1"))
                             if version != default)
            self.shared[key] = self.start(f"a{suffix}", containerd=containerd, runc=runc)
        return self.shared[key]


@pytest.fixture(scope="session")
def nodes(world: World) -> Nodes:
    return Nodes(world)


@pytest.fixture(scope="session")
def containerd_version(request: pytest.FixtureRequest) -> str:
    """"1.6" or "2": `--containerd`, unless a test parametrizes it (indirect=True)."""
    return str(getattr(request, "param", request.config.getoption("--containerd")))


@pytest.fixture(scope="session")
def runc_version(request: pytest.FixtureRequest) -> str:
    """"1.1" or "1.3", torpor-runc's low-level runc: `--runc`, unless a test parametrizes it."""
    return str(getattr(request, "param", request.config.getoption("--runc")))


@pytest.fixture(scope="session")
def node(nodes: Nodes, containerd_version: str, runc_version: str) -> Node:
    """The session's main containerd (node A), of the versions asked for."""
    return nodes.main_node(containerd_version, runc_version)


@pytest.fixture
def container_name(request: pytest.FixtureRequest) -> str:
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")
    return name[-40:].strip("-")


def run_torpor(node: Node, *args: str, check: bool = True, timeout: float = 300,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The torpor CLI against `node`, as a user runs it (`env`: added to the node's)."""
    cmd = [str(node.bin_dir / "torpor"), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, env={**node.env, **(env or {})},
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n"
                             f"{result.stdout}{result.stderr}")
    return result
