"""What a lazy restore keeps of the packs it fetched: whole and checked, or nothing."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from torpor.errors import DigestMismatch
from torpor.formats.chunk_index import PackRecord
from torpor.lazy.keep import PackKeeper


def pack_of(data: bytes) -> PackRecord:
    return PackRecord("sha256:" + hashlib.sha256(data).hexdigest(), len(data))


def test_the_gaps_are_fetched_and_the_pack_is_checked_whole(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    keeper = PackKeeper(str(tmp_path / "kept"), [pack_of(data)])
    keeper.add(0, 1 << 20, data[1 << 20:2 << 20])        # what the pages asked for
    assert keeper.gaps(0) == [(0, 1 << 20), (2 << 20, 1 << 20)]
    asked = []

    def remote(digest: str, offset: int, length: int) -> bytes:
        asked.append((offset, length))
        return data[offset:offset + length]

    layout = tmp_path / "layout"
    fetched = keeper.finish(remote, lambda d, s: None, layout)
    assert fetched == 2 << 20 and asked == [(0, 1 << 20), (2 << 20, 1 << 20)]
    blob = layout / "blobs" / "sha256" / hashlib.sha256(data).hexdigest()
    assert blob.read_bytes() == data


def test_a_tampered_range_keeps_nothing(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    keeper = PackKeeper(str(tmp_path / "kept"), [pack_of(data)])
    keeper.add(0, 0, data[:4096] + b"x" + data[4097:])
    with pytest.raises(DigestMismatch):
        keeper.finish(lambda d, o, n: b"", lambda d, s: None, tmp_path / "layout")
    assert not list((tmp_path / "layout" / "blobs" / "sha256").iterdir())


def test_a_pack_already_here_is_linked_not_fetched(tmp_path: Path) -> None:
    data = os.urandom(4096)
    here = tmp_path / "store-blob"
    here.write_bytes(data)
    keeper = PackKeeper(str(tmp_path / "kept"), [pack_of(data)])

    def remote(digest: str, offset: int, length: int) -> bytes:
        raise AssertionError("fetched a pack this node holds")

    assert keeper.finish(remote, lambda d, s: str(here), tmp_path / "layout") == 0
    blob = tmp_path / "layout" / "blobs" / "sha256" / hashlib.sha256(data).hexdigest()
    assert blob.read_bytes() == data
