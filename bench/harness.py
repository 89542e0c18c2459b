"""The demo's and benchmarks' private world: torpor's launchers, containerd nodes, a test image.

It reuses the test suite's helpers (tests/support): the same real components, started the
same way, on temporary roots, and cleaned up by pid at the end.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import images
from tests.support.containerd import Node
from tests.support.netns import NetNS
from torpor.runtime_config import launchers

REPO = Path(__file__).resolve().parent.parent
IMAGE = "localhost/torpor-demo/busybox:1"


class World:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.bin = base / "bin"
        launchers.install(str(self.bin), str(base / "lib" / "runc"), python=sys.executable)
        self.state_dir = base / "torpor-state"
        self.config = base / "torpor.toml"
        self.config.write_text(f'[runtime]\nstate_dir = "{self.state_dir}"\n')
        workloads = base / "workloads"
        workloads.mkdir()
        extra = {}
        for name in ("kvserver", "memhog"):
            data = images.compile_static(REPO / "tests" / "workloads" / f"{name}.c", workloads / name)
            extra[f"bin/{name}"] = (data, 0o755)
        self.layout = base / "image-layout"
        images.write_layout(self.layout, IMAGE, extra)
        self.image_tar = images.layout_tar(self.layout, base / "image.tar")
        self.nodes: list[Node] = []
        self.netns: list[NetNS] = []

    def node(self, name: str, own_netns: bool = False) -> Node:
        netns = NetNS(f"torpor-{name}") if own_netns else None
        if netns:
            self.netns.append(netns)
        node = Node(self.base / "nodes", name, self.bin, self.config, netns=netns)
        self.nodes.append(node)
        node.start()
        node.ctr("images", "import", str(self.image_tar))
        return node

    def close(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        for netns in self.netns:
            netns.delete()


@contextmanager
def world() -> Iterator[World]:
    base = Path(tempfile.mkdtemp(prefix="torpor-bench-", dir="/var/tmp"))
    base.chmod(0o755)
    w = World(base)
    try:
        yield w
    finally:
        w.close()
        shutil.rmtree(base, ignore_errors=True)
