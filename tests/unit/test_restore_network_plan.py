"""torpor-runc restore's network plan (shim/restore_cmd.py prepare_network): a namespace runc
makes gets the recorded addresses on lo from torpor-hook; a container on the host's network
gets no plan at all, so that nothing of a checkpoint is ever applied to the host's own lo."""

from __future__ import annotations

import json
from pathlib import Path

from torpor.shim.restore_cmd import prepare_network

from .samples import STATE


def spec(*namespaces: dict[str, str]) -> dict[str, object]:
    return {"linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}, *namespaces]}}


def test_a_namespace_runc_makes_gets_the_recorded_addresses(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    assert prepare_network(spec({"type": "network"}), STATE, str(plan),
                           str(tmp_path / "criu.conf")) is False
    written = json.loads(plan.read_text())
    assert written["up"] == ["lo"]
    assert [a["address"] for a in written["addresses"]] == ["10.1.2.3"]


def test_the_hosts_network_gets_no_plan(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    assert prepare_network(spec(), STATE, str(plan), str(tmp_path / "criu.conf")) is False
    assert not plan.exists()
