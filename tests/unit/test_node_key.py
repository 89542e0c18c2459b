"""The node's sealing key appears whole or not at all, and a broken one is never a key."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from torpor.capture import node_key, restore_policy
from torpor.config import Config
from torpor.errors import ConfigError
from torpor.formats.spec_requests import SpecRequests


class Recorded:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def debug(self, msg: str) -> None:
        pass

    def info(self, msg: str) -> None:
        pass

    def warning(self, msg: str) -> None:
        self.warnings.append(msg)

    def error(self, msg: str) -> None:
        pass


HOOKED = SpecRequests.of({"hooks": {"prestart": [{"path": "/bin/sh", "args": ["sh", "-c", "x"]}]}})


def test_an_empty_key_left_by_a_killed_write_is_replaced_and_cannot_forge_a_seal(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "node.key").write_bytes(b"")          # killed between create and write
    forged = restore_policy.seal(b"", HOOKED)       # anyone can compute this one
    log = Recorded()
    key = restore_policy.node_key(Config({"image": {"store": str(store)}}), log)
    assert len(key) == 32 and key != b""
    assert not restore_policy.sealed_here(key, HOOKED, forged)
    assert (store / "node.key").read_bytes() == key
    assert (store / "node.key").stat().st_mode & 0o777 == 0o600
    assert (store / "node.key.broken").read_bytes() == b""
    assert len(log.warnings) == 1 and "0 bytes" in log.warnings[0]
    assert node_key.load(str(store)) == key         # and from then on it is read


def test_a_short_or_long_key_file_is_never_used(tmp_path: Path) -> None:
    for content in (b"x" * 10, b"y" * 31, b"z" * 33, b"w" * 4096):
        store = tmp_path / str(len(content))
        store.mkdir()
        (store / "node.key").write_bytes(content)
        key = node_key.load(str(store))
        assert len(key) == 32 and key not in content
        assert (store / "node.key.broken").read_bytes() == content


def _load(store: str) -> bytes:
    return node_key.load(store)


def test_checkpoints_racing_for_the_first_key_all_get_the_same_whole_key(tmp_path: Path) -> None:
    for round_ in range(5):
        store = str(tmp_path / f"store{round_}")
        with multiprocessing.get_context("fork").Pool(6) as pool:
            keys = pool.map(_load, [store] * 12)
        assert len(set(keys)) == 1 and len(keys[0]) == 32
        assert sorted(os.listdir(store)) == ["node.key", "node.key.lock"]   # no temp file left


def test_a_key_that_cannot_be_read_is_an_error_in_words(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "node.key").mkdir(parents=True)
    with pytest.raises(ConfigError, match="cannot read this node's sealing key"):
        node_key.load(str(store))
