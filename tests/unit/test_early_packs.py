"""Big pages images packed while CRIU still writes them (image/early_packs.py): the packs made
during the "dump" are handed out as they close, and the generation written with them is byte
for byte the one written without, whether it takes them or, where an earlier file holds some of
their chunks, packs the file again. Pack sizes are scaled down (settled at 2 MiB, not 2 GiB).

The writer appends as CRIU does (test_follow.append_slowly)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from torpor.formats.chunk_index import PackRecord
from torpor.image import follow
from torpor.image.early_packs import EarlyPacker, EarlyPacks
from torpor.image.follow import DumpFollower, Followed
from torpor.image.packfile import LEVEL
from torpor.image.packs import ChunkLocation, PackSizing, WrittenGeneration, known_chunks, write_generation

from .test_follow import FILES, MIB, append_slowly, assert_same, wait_caught_up

SIZING = PackSizing(smallest=128 << 10, largest=512 << 10, per_file=4)   # settled: 2 MiB


@pytest.fixture(autouse=True)
def small_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "WINDOW", MIB)
    monkeypatch.setattr(follow, "GUARD", 256 << 10)


def dump_packed(root: Path, files: dict[str, bytes], known: Mapping[str, ChunkLocation],
                level: int = LEVEL) -> tuple[Followed, EarlyPacks, list[PackRecord]]:
    """The files written one after the other under root/criu while a follower and an early
    packer (into root/packs) follow; the packs it handed out before it stopped."""
    criu = root / "criu"
    criu.mkdir(parents=True)
    handed: list[PackRecord] = []
    lock = threading.Lock()

    def on_pack(pack: PackRecord) -> None:
        assert (root / "packs" / pack.digest.removeprefix("sha256:")).exists()
        with lock:
            handed.append(pack)

    with DumpFollower(str(criu)) as follower:
        with EarlyPacker(follower, str(root / "packs"), known, level, SIZING, on_pack) as packer:
            for n, (name, data) in enumerate(files.items()):
                append_slowly(criu / name, data, n)
            wait_caught_up(follower, criu)
            big = {name for name, data in files.items() if len(data) >= SIZING.settled}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (   # the packer caught up with it
                    set(packer.files) != big or any(early.end < follower.files[name].end
                                                    for name, early in packer.files.items())):
                time.sleep(0.01)
        with lock:
            handed = list(handed)
    assert follower.followed is not None and packer.packed is not None
    return follower.followed, packer.packed, handed


def generation(root: Path, packs: Path, known: Mapping[str, ChunkLocation] | None = None,
               followed: Followed | None = None, early: EarlyPacks | None = None,
               level: int = LEVEL) -> WrittenGeneration:
    packs.mkdir(exist_ok=True)
    names = sorted(f"criu/{p.name}" for p in (root / "criu").iterdir())
    try:
        return write_generation(str(root), names, str(packs), known=known, sizing=SIZING,
                                workers=2, level=level,
                                followed=followed.under("criu/") if followed else None,
                                early=early.under("criu/") if early else None)
    finally:
        if early is not None:
            early.abandon()


def test_big_files_are_packed_during_the_dump_as_the_generation_packs_them(
        tmp_path: Path) -> None:
    followed, packed, handed = dump_packed(tmp_path, FILES, {})
    # the two files past 2 MiB were packed from their start, the small one was not
    assert set(packed.files) == {"pages-1.img", "pages-2.img"}
    assert all(early.end > 2 * MIB for early in packed.files.values())
    assert handed, "no pack was whole before the dump ended"
    with_early = generation(tmp_path, tmp_path / "packs", None, followed, packed)
    without = generation(tmp_path, tmp_path / "packs-b")
    assert_same(with_early, without, tmp_path / "packs", tmp_path / "packs-b")
    # what was handed out during the dump is what the generation refers to
    assert {p.digest for p in handed} <= {p.digest for p in with_early.index.packs}
    assert with_early.stats.early_bytes >= sum(e.end for e in packed.files.values()) > 4 * MIB
    assert without.stats.early_bytes == 0
    assert not list((tmp_path / "packs").glob(".pack-*"))   # no temporary file left


def test_a_previous_generations_chunks_are_referred_to_not_packed_again(tmp_path: Path) -> None:
    first = tmp_path / "first"
    (first / "criu").mkdir(parents=True)
    changed = bytearray(FILES["pages-2.img"])
    changed[MIB:MIB + 4096] = bytes(range(256)) * 16   # one page of the big file differs
    (first / "criu" / "pages-2.img").write_bytes(bytes(changed))
    (first / "criu" / "pages-1.img").write_bytes(FILES["pages-1.img"])
    previous = generation(first, first / "packs")
    known = known_chunks(previous.index)
    followed, packed, _ = dump_packed(tmp_path, FILES, known)
    with_early = generation(tmp_path, tmp_path / "packs", known, followed, packed)
    without = generation(tmp_path, tmp_path / "packs-b", known)
    assert_same(with_early, without, tmp_path / "packs", tmp_path / "packs-b")
    assert with_early.stats.early_bytes > 4 * MIB
    # only about the changed page's chunk is new (a pack of its own: the file's packs close
    # around it), not the whole file again
    assert with_early.stats.new_bytes < MIB


@pytest.mark.parametrize("at", [0, 2 * MIB])
def test_packs_from_a_chunk_an_earlier_file_holds_on_are_made_again(
        tmp_path: Path, at: int) -> None:
    """pages-1.img (small, packed first by name) holds 1 MiB of pages-2.img from `at`: the
    generation places those chunks in pages-1.img's pack, so it takes pages-2.img's early packs
    closed before them (none from the start) and packs the rest itself (a forked worker's
    image holds its parent's pages alike)."""
    big = random.Random(6).randbytes(4 * MIB)
    files = {"pages-1.img": big[at:at + MIB], "pages-2.img": big}
    followed, packed, handed = dump_packed(tmp_path, files, {})
    assert set(packed.files) == {"pages-2.img"} and handed
    with_early = generation(tmp_path, tmp_path / "packs", None, followed, packed)
    without = generation(tmp_path, tmp_path / "packs-b")
    assert_same(with_early, without, tmp_path / "packs", tmp_path / "packs-b")
    if at:
        assert 0 < with_early.stats.early_bytes <= at + (512 << 10)   # a chunk may straddle
    else:
        assert with_early.stats.early_bytes == 0


def test_early_packs_at_another_level_are_not_taken(tmp_path: Path) -> None:
    followed, packed, _ = dump_packed(tmp_path, FILES, {}, level=LEVEL + 2)
    with_early = generation(tmp_path, tmp_path / "packs", None, followed, packed)
    without = generation(tmp_path, tmp_path / "packs-b")
    assert_same(with_early, without, tmp_path / "packs", tmp_path / "packs-b")
    assert with_early.stats.early_bytes == 0
