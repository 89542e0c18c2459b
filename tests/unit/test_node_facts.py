"""Which runc a node's facts are about."""

from __future__ import annotations

from pathlib import Path

from torpor.node import facts


def test_a_node_records_the_runc_torpor_runc_hands_over_to(tmp_path: Path) -> None:
    runc = tmp_path / "runc-1.3"
    assert facts.low_level_runc(str(runc)) == str(runc)  # a path: as configured
    assert facts.low_level_runc("sh") == facts.which("sh")
    assert facts.low_level_runc("no-such-runc-here") is None
