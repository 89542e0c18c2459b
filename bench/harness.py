"""The demo's and benchmarks' private world: the test suite's own (tests/support/world.py), with
the demo's image name; the same real components, started the same way, cleaned up by pid."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.world import World

IMAGE = "localhost/torpor-demo/busybox:1"

__all__ = ["IMAGE", "World", "world"]


@contextmanager
def world() -> Iterator[World]:
    from tests.support.world import world as make_world

    with make_world(IMAGE, prefix="torpor-bench-") as w:
        yield w
