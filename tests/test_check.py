"""`torpor check` answers "would a checkpoint and a restore work here now?" (issue 24): on a
node that has everything it says ready (exit 0), and on nodes each missing one piece in turn
(no containerd at the address, no shim launcher on containerd's PATH, no runtime class in its
config, CRIU only outside containerd's PATH, a runc torpor-runc cannot find) it fails that
requirement, with the command that fixes it, and exits 1."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Nodes
from .support.containerd import Node
from .support.registry import Registry

pytestmark = pytest.mark.real
STANDARD_PATH = "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"   # no /usr/local/sbin (CRIU)


def check(node: Node, *args: str, address: str | None = None) -> tuple[int, dict[str, dict]]:  # type: ignore[type-arg]
    cmd = [str(node.bin_dir / "torpor"), *(["--address", address] if address else []),
           "check", "--json", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, env=node.env, timeout=120)
    report = json.loads(result.stdout)
    assert (report["verdict"] == "ready") == (result.returncode == 0), result
    return result.returncode, {r["name"]: r for r in report["requirements"]}


def failed(requirements: dict[str, dict]) -> set[str]:  # type: ignore[type-arg]
    return {name for name, r in requirements.items() if r["status"] == "fail"}


@pytest.fixture(scope="module")
def registry(session_dir: Path) -> Iterator[Registry]:
    started = Registry(session_dir / "registries", "check").start()
    yield started
    started.stop()


def test_a_node_with_everything_is_ready(node: Node, registry: Registry) -> None:
    code, reqs = check(node, f"{registry.host}/check/x:1")
    assert code == 0 and failed(reqs) == set(), reqs
    assert reqs["containerd"]["detail"].endswith(f"({node.address})")
    assert reqs["torpor runtime"]["status"] == "ok"
    assert reqs["shim launcher"]["detail"] == str(node.bin_dir / "containerd-shim-torpor-v2")
    assert "as " in reqs["runc"]["detail"] and reqs["criu"]["status"] == "ok"
    assert reqs["registry"]["status"] == "ok"
    lazy = reqs["uffd (lazy restore)"]   # install-deps' CRIU, its lazy-pages not spinning
    assert lazy["status"] == "ok" and "torpor's CRIU build" in lazy["detail"], lazy
    code, reqs = check(node, "127.0.0.1:9/check/x:1")   # a registry nobody serves
    assert code == 1 and failed(reqs) == {"registry"}


def test_no_containerd_at_the_address(node: Node, tmp_path: Path) -> None:
    code, reqs = check(node, address=str(tmp_path / "containerd.sock"))
    assert code == 1
    assert reqs["containerd"]["status"] == "fail"
    assert f"nothing answers at {tmp_path / 'containerd.sock'}" in reqs["containerd"]["detail"]
    assert "--address" in reqs["containerd"]["fix"]


@pytest.mark.parametrize("missing", ["shim launcher", "torpor runtime", "criu", "runc"])
def test_each_missing_piece_fails_with_its_fix(nodes: Nodes, session_dir: Path,
                                               torpor_config: Path, missing: str) -> None:
    name = f"chk-{missing.replace(' ', '-')}"
    if missing == "shim launcher":   # containerd's PATH lacks torpor's bin directory
        node = nodes.start(name, extra_env={"PATH": f"/usr/local/sbin:{STANDARD_PATH}"})
    elif missing == "torpor runtime":
        node = nodes.start(name, torpor_runtime=False)
    elif missing == "criu":          # CRIU is in /usr/local/sbin, outside containerd's PATH
        node = nodes.start(name, extra_env={"PATH": f"{nodes.world.bin}:{STANDARD_PATH}"})
    else:                            # torpor-runc's [runtime] path names no runc
        config = session_dir / f"{name}.toml"
        config.write_text(torpor_config.read_text() + '\n[runtime]\npath = "/nonexistent/runc"\n'
                          if "[runtime]" not in torpor_config.read_text() else
                          torpor_config.read_text().replace(
                              "[runtime]\n", '[runtime]\npath = "/nonexistent/runc"\n'))
        node = nodes.start(name, config=config)
    try:
        code, reqs = check(node)
        assert code == 1
        assert failed(reqs) == {missing}, reqs
        fix = reqs[missing]["fix"]
        assert {"shim launcher": "ln -s", "torpor runtime": "torpor runtime-config containerd "
                f"--install {node.config_path}", "criu": "ln -s /usr/local/sbin/criu",
                "runc": "[runtime] path"}[missing] in fix, reqs[missing]
    finally:
        node.stop()
