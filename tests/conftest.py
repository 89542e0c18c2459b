"""Shared fixtures: torpor's launchers, a private containerd per session, the test image.

Real components only (containerd, runc, CRIU, docker-registry); the one fake is the GPU driver.
Everything lives under one temporary directory per session and is removed at the end, with
every process the session started ended by pid.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from torpor.runtime_config import launchers

from .support import images
from .support.containerd import Node
from .support.netns import NetNS

REPO = Path(__file__).resolve().parent.parent
IMAGE = "localhost/torpor-test/busybox:1"
REQUIRED = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "criu", "docker-registry",
            "skopeo", "gcc", "ip", "iptables")


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.geteuid() != 0:
        pytest.exit("torpor's tests start containerd, runc and CRIU: run them as root", 2)
    missing = [tool for tool in REQUIRED if not shutil.which(tool, path=os.environ.get("PATH", "")
                                                             + ":/usr/local/sbin:/usr/sbin")]
    if missing:
        pytest.exit(f"missing {', '.join(missing)}: run `make deps` (packaging/install-deps.sh)", 2)


@pytest.fixture(scope="session")
def session_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="torpor-test-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def torpor_bin(session_dir: Path) -> Path:
    """torpor-runc, torpor-hook, torpor and containerd-shim-torpor-v2 for this checkout."""
    bin_dir = session_dir / "bin"
    launchers.install(str(bin_dir), str(session_dir / "lib" / "runc"), python=sys.executable)
    return bin_dir


@pytest.fixture(scope="session")
def state_dir(session_dir: Path) -> Path:
    return session_dir / "torpor-state"


@pytest.fixture(scope="session")
def torpor_config(session_dir: Path, state_dir: Path) -> Path:
    path = session_dir / "torpor.toml"
    path.write_text(f'[runtime]\nstate_dir = "{state_dir}"\n')
    return path


@pytest.fixture(scope="session")
def workloads(session_dir: Path) -> dict[str, bytes]:
    out = session_dir / "workloads"
    out.mkdir(exist_ok=True)
    return {name: images.compile_static(REPO / "tests" / "workloads" / f"{name}.c", out / name)
            for name in ("kvserver", "memhog")}


@pytest.fixture(scope="session")
def test_image(session_dir: Path, workloads: dict[str, bytes]) -> dict[str, object]:
    layout = session_dir / "image-layout"
    digests = images.write_layout(layout, IMAGE, {
        f"bin/{name}": (data, 0o755) for name, data in workloads.items()})
    tar = images.layout_tar(layout, session_dir / "image.tar")
    return {"name": IMAGE, "layout": layout, "tar": tar, **digests}


class Nodes:
    """Starts containerd nodes for the session and stops them all at the end."""

    def __init__(self, base: Path, bin_dir: Path, config: Path, image: dict[str, object]):
        self.base, self.bin_dir, self.config, self.image = base, bin_dir, config, image
        self.started: list[Node] = []
        self.namespaces: list[NetNS] = []

    def start(self, name: str, own_netns: bool = False, cri: bool = False,
              config: Path | None = None, extra_env: dict[str, str] | None = None) -> Node:
        """A new containerd node; `config` replaces the session's torpor config for it, and
        `extra_env` reaches containerd, its shims and so torpor-runc."""
        netns = NetNS(f"torpor-{name}") if own_netns else None
        if netns:
            self.namespaces.append(netns)
        node = Node(self.base, name, self.bin_dir, config or self.config, netns=netns, cri=cri,
                    extra_env=extra_env)
        self.started.append(node)
        node.start()
        node.ctr("images", "import", str(self.image["tar"]))
        return node

    def stop_all(self) -> None:
        for node in reversed(self.started):
            node.stop()
        for netns in self.namespaces:
            netns.delete()


@pytest.fixture(scope="session")
def nodes(session_dir: Path, torpor_bin: Path, torpor_config: Path,
          test_image: dict[str, object]) -> Iterator[Nodes]:
    pool = Nodes(session_dir / "nodes", torpor_bin, torpor_config, test_image)
    yield pool
    pool.stop_all()


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
