"""Which runc a node's facts are about, and whether its CRIU is torpor's build."""

from __future__ import annotations

from pathlib import Path

from torpor.node import facts


def test_a_node_records_the_runc_torpor_runc_hands_over_to(tmp_path: Path) -> None:
    runc = tmp_path / "runc-1.3"
    assert facts.low_level_runc(str(runc)) == str(runc)  # a path: as configured
    assert facts.low_level_runc("sh") == facts.which("sh")
    assert facts.low_level_runc("no-such-runc-here") is None


def test_torpors_criu_build_is_told_from_a_stock_one_by_its_mark(tmp_path: Path) -> None:
    """The mark packaging/criu/lazy-pages-wait.patch compiles in, anywhere in the binary."""
    ours, stock = tmp_path / "criu", tmp_path / "criu-stock"
    ours.write_bytes(b"\x7fELF" + bytes(1 << 20) + facts.CRIU_LAZY_PAGES_WAITS + bytes(99))
    stock.write_bytes(b"\x7fELF" + bytes(1 << 20) + b"torpor: criu lazy-pages")
    assert facts.criu_lazy_pages_waits(str(ours))
    assert not facts.criu_lazy_pages_waits(str(stock))
    assert not facts.criu_lazy_pages_waits(str(tmp_path / "none"))
    patch = Path(__file__).parents[2] / "packaging" / "criu" / "lazy-pages-wait.patch"
    assert b'"' + facts.CRIU_LAZY_PAGES_WAITS + b'"' in patch.read_bytes()
