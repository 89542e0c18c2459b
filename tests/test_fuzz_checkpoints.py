"""The mutation fuzzer (tests/support/fuzz.py) over one genuine checkpoint, as a directory, an
OCI layout and an image in a registry, restored with `torpor restore` on a node whose policy is
the default. Every case is refused in words or restored without effect outside its targets: no
traceback, no hang, nothing left behind, the canary tree unchanged. A few hundred cases of fixed
seeds here (python -m bench.fuzz runs as many as asked); cases that once found a bug stay, by
name, in REGRESSIONS.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Nodes
from .support import fuzz
from .support.registry import Registry

pytestmark = pytest.mark.real
SEED = 20
CASES = {"dir": 90, "layout": 70, "registry": 40}
# cases (FORM:SEED:N) that found a bug, kept as fixed regression cases
REGRESSIONS = [
    "dir:1:1",    # mount options not a list: TypeError in torpor-runc (capture/volumes.py)
    "dir:1:35",   # a socket address not an IP: ValueError in torpor-runc (formats/network.py)
]
# found, not fixed here (issue 20 item 3, deadlines): criu/pages-1.img truncated, its listed size
# made to match: CRIU's restorer fails, CRIU hangs in wait4, torpor restore never returns and
# `ctr tasks delete --force` hangs too, until runc and CRIU are killed by hand.
KNOWN_HANGS = ["dir:3:152"]


@pytest.fixture(scope="module")
def genuine(nodes: Nodes, session_dir: Path, test_image: dict[str, object]) -> Iterator[fuzz.Genuine]:
    base = session_dir / "fuzz"
    node = nodes.start("fuzz", config=fuzz.node_config(base))
    registry = Registry(base / "registry", "plain").start()
    try:
        yield fuzz.make_genuine(node, base, str(test_image["name"]), registry)
    finally:
        registry.stop()


def run(genuine: fuzz.Genuine, names: list[str]) -> fuzz.Summary:
    summary = fuzz.Summary()
    started = time.monotonic()
    for name in names:
        summary.add(fuzz.run_case(genuine, name))
    print(f"\n{summary.text()}\n({time.monotonic() - started:.0f} s)")
    return summary


@pytest.mark.parametrize("form", fuzz.FORMS)
def test_an_unchanged_copy_restores(genuine: fuzz.Genuine, form: str) -> None:
    """The fuzzer's copies, rewritten digests and pushes are faithful: with no mutation the
    checkpoint restores, so what the mutations reach is the restore, not a broken harness."""
    result = fuzz.run_case(genuine, f"{form}:0:0", mutate=False)
    assert result.outcome == "restored", result


@pytest.mark.parametrize("form", fuzz.FORMS)
def test_mutated_checkpoints_are_refused_in_words_or_restored_safely(
        genuine: fuzz.Genuine, form: str) -> None:
    summary = run(genuine, fuzz.cases(form, SEED, CASES[form]))
    assert not summary.failures(), summary.text()
    assert summary.counts()["unpushable"] < CASES[form] // 4, summary.text()


def test_cases_that_once_found_a_bug(genuine: fuzz.Genuine) -> None:
    summary = run(genuine, REGRESSIONS)
    assert not summary.failures(), summary.text()
