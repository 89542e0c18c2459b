"""Checkpoint times: to the millisecond, so that two generations of one second are ordered;
older ones (whole seconds) still read."""

from __future__ import annotations

from torpor.formats import timestamps
from torpor.ops.prune import Retention, chosen_to_keep


def test_written_to_the_millisecond_and_read_either_way() -> None:
    assert timestamps.now(1764873577.1234) == "2025-12-04T18:39:37.123Z"
    assert timestamps.epoch("2025-12-04T18:39:37.123Z") == 1764873577.123
    assert timestamps.epoch("2025-12-04T18:39:37Z") == 1764873577.0
    assert timestamps.epoch("yesterday") is None


def test_two_generations_of_one_second_keep_the_newer() -> None:
    first, second = timestamps.now(1000.100), timestamps.now(1000.900)
    assert chosen_to_keep([first, second], lambda c: c, Retention(keep=1), now=2000.0) == [second]
    assert chosen_to_keep(["2025-12-04T18:39:37Z", "2025-12-04T18:39:37.500Z"], lambda c: c,
                          Retention(keep=1), now=2e9) == ["2025-12-04T18:39:37.500Z"]
