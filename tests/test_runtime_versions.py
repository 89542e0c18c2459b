"""The runc and CRIU a checkpoint records, and a restore is checked against, are the ones
containerd's runtime runs (issue 24), whatever else is on the user's PATH.

Two identical nodes whose torpor-runc hands over to runc 1.3 (containerd's PATH and torpor's
`[runtime] path`); the user's shell finds Debian's runc 1.1.5 first and a torpor config that
names no runc. A checkpoint taken from that shell records 1.3 (what ran it), and a checkpoint
recording 1.3 restores on the other node from that shell: the node is compared by what its
shim will run, not by `which runc`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .conftest import Nodes, run_torpor
from .support import ecosystem
from .support.containerd import Node
from .support.workload import COUNTER, containers, read_counter, wait_counter_above

pytestmark = pytest.mark.real
SHIM = ["--runtime", "io.containerd.torpor.v2"]


torpor = run_torpor   # (tests/conftest.py)


def version_of(runc: str) -> str:
    out = subprocess.run([runc, "--version"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0].split()[-1]


@pytest.fixture(scope="module")
def runc13_nodes(nodes: Nodes, session_dir: Path) -> tuple[Node, Node]:
    return nodes.start("rv-a", runc="1.3"), nodes.start("rv-b", runc="1.3")


def test_versions_are_the_runtimes_not_the_users_path(runc13_nodes: tuple[Node, Node],
                                                      test_image: dict[str, object],
                                                      torpor_config: Path, tmp_path: Path) -> None:
    a, b = runc13_nodes
    shims_runc = version_of(str(ecosystem.runc_path("1.3")))
    debian_runc = version_of("/usr/sbin/runc")
    assert shims_runc != debian_runc
    # the user's shell: Debian's runc first on PATH, a torpor config that names no runc
    shell = {"PATH": f"/usr/sbin:{a.env['PATH']}", "TORPOR_CONFIG": str(torpor_config)}
    with containers(a) as on_a, containers(b) as on_b:
        on_a.append("rv")
        on_b += ["rv-1", "rv-2"]
        a.ctr("run", "-d", *SHIM, str(test_image["name"]), "rv", "sh", "-c", COUNTER)
        wait_counter_above(a, "rv", 2)
        torpor(a, "checkpoint", "rv", "-o", str(tmp_path / "from-shell"), "--leave-running",
               env=shell)
        recorded = json.loads(torpor(a, "inspect", str(tmp_path / "from-shell"), "--json")
                              .stdout)["node"]
        assert recorded["runc_version"] == shims_runc   # the one that ran it, not `which runc`
        assert recorded["criu_version"] == "4.2.1"
        torpor(a, "checkpoint", "rv", "-o", str(tmp_path / "from-node"))
        # restored on the identical node, from the same shell: compared with what B's shim runs
        for source, name in (("from-node", "rv-1"), ("from-shell", "rv-2")):
            torpor(b, "restore", str(tmp_path / source), "--name", name, env=shell)
            wait_counter_above(b, name, read_counter(b, name) + 2)
