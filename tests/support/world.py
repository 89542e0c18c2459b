"""A private world of real components, for the tests, the demo and the benchmarks alike:
torpor's launchers for this checkout, a torpor config with its own state dir, the test workloads
compiled static, a busybox-based test image, and containerd nodes (each optionally in its own
network namespace). Everything lives under one directory and is stopped by pid at the end."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torpor.runtime_config import launchers

from . import ecosystem, images
from .containerd import Node
from .netns import NetNS

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = ("kvserver", "memhog")


class World:
    def __init__(self, base: Path, image_name: str) -> None:
        self.base = base
        self.bin = base / "bin"
        launchers.install(str(self.bin), str(base / "lib" / "runc"), python=sys.executable)
        self.state_dir = base / "torpor-state"
        self.config = base / "torpor.toml"
        # host directories that restores may bind-mount without --volume (ctr restores have none)
        self.volumes = base / "volumes"
        self.volumes.mkdir(mode=0o700)
        self.store = base / "store"  # the world's own image store, not the node's
        self.config.write_text(f'[runtime]\nstate_dir = "{self.state_dir}"\n'
                               f'log_dir = "{self.state_dir}-logs"\n'
                               f'[restore]\nmount_sources = ["{self.volumes}"]\n'
                               f'[image]\nstore = "{self.store}"\n')
        out = base / "workloads"
        out.mkdir(exist_ok=True)
        self.workloads = {name: images.compile_static(REPO / "tests" / "workloads" / f"{name}.c",
                                                      out / name) for name in WORKLOADS}
        self.image_layout = base / "image-layout"
        digests = images.write_layout(self.image_layout, image_name, {
            f"bin/{name}": (data, 0o755) for name, data in self.workloads.items()})
        self.image_tar = images.layout_tar(self.image_layout, base / "image.tar")
        self.image: dict[str, object] = {"name": image_name, "layout": self.image_layout,
                                         "tar": self.image_tar, **digests}
        self.nodes: list[Node] = []
        self.namespaces: list[NetNS] = []

    def node(self, name: str, own_netns: bool = False, cri: bool = False,
             config: Path | None = None, extra_env: dict[str, str] | None = None,
             containerd: str = "1.6", runc: str = "1.1", torpor_runtime: bool = True) -> Node:
        """A new containerd node with the test image imported; `config` replaces the world's
        torpor config for it, and `extra_env` reaches containerd, its shims and torpor-runc.
        `containerd` ("1.6" or "2") and `runc` ("1.1" or "1.3", torpor-runc's low-level runtime
        and the node's plain runc) pick versions (tests/support/ecosystem.py)."""
        netns = NetNS(f"torpor-{name}") if own_netns else None
        if netns:
            self.namespaces.append(netns)
        node = Node(self.base / "nodes", name, self.bin, config or self.config, netns=netns,
                    cri=cri, extra_env=extra_env,
                    containerd_bin=ecosystem.containerd_bin(containerd),
                    runc=ecosystem.runc_path(runc), torpor_runtime=torpor_runtime)
        self.nodes.append(node)
        node.start()
        node.ctr("images", "import", str(self.image_tar))
        return node

    def close(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        for netns in self.namespaces:
            netns.delete()


@contextmanager
def world(image_name: str, prefix: str = "torpor-") -> Iterator[World]:
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    base.chmod(0o755)
    w = World(base, image_name)
    try:
        yield w
    finally:
        w.close()
        shutil.rmtree(base, ignore_errors=True)
