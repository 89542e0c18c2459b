"""A download cut off midway resumes from the bytes already received (HTTP Range), as
docs/registry.md says; it does not start over."""

from __future__ import annotations

from pathlib import Path

import pytest

from torpor.formats.digests import sha256_file
from torpor.registry import pull, push_layout

from ..support.checkpoint_layouts import write_single_blob_layout
from ..support.registry import Registry
from ..support.tcp_proxy import DownloadDroppingProxy
from .conftest import FAST

pytestmark = pytest.mark.real
MIB = 1 << 20


def test_a_dropped_download_resumes_where_it_stopped(plain_registry: Registry,
                                                     tmp_path: Path) -> None:
    layout = write_single_blob_layout(tmp_path / "layout", 5 * MIB)
    push_layout(layout.root, f"{plain_registry.host}/resume/dl:1", options=FAST)
    # blob GETs: the config (phase 1), then the layer: cut the layer's answer after 2 MiB
    proxy = DownloadDroppingProxy(plain_registry.port, nth=2, body_bytes=2 * MIB)
    try:
        pulled = pull(f"{proxy.host}/resume/dl:1", tmp_path / "pulled", options=FAST)
    finally:
        proxy.close()
    assert proxy.dropped
    assert proxy.forwarded_down < 5 * MIB + MIB, "resumed, not started again"
    layer = layout.state_layers[0]
    blob = pulled.layout / "blobs" / "sha256" / layer.split(":")[1]
    assert sha256_file(str(blob)) == layer
