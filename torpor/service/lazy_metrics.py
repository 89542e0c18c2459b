"""The lazy restores under way on this node, as Prometheus gauges read at each scrape from
the records torpor.lazy.progress keeps (whether the restore runs in torpord or in-process)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from torpor.lazy import progress as lazy_progress


class LazyRestores:
    """torpor_lazy_restore_bytes and torpor_lazy_restore_placed_bytes{namespace,container}."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir

    def collect(self) -> Iterator[Any]:
        total = GaugeMetricFamily("torpor_lazy_restore_bytes", "memory a lazy restore under "
                                  "way brings in after the workload runs",
                                  labels=["namespace", "container"])
        placed = GaugeMetricFamily("torpor_lazy_restore_placed_bytes", "of it, placed so far",
                                   labels=["namespace", "container"])
        for p in lazy_progress.current(self.state_dir):
            total.add_metric([p.namespace, p.container], p.lazy_bytes)
            placed.add_metric([p.namespace, p.container], p.placed_bytes)
        yield total
        yield placed
