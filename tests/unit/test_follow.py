"""Pages images cut while they are written (image/follow.py): a generation written with what a
DumpFollower made is byte for byte the one written without it, whatever the follower saw.

The writer here appends as CRIU does: pieces of any size, front to back, never going back.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from torpor import nice
from torpor.image import follow
from torpor.image.chunker import DEFAULT_PARAMS, PAGE, ChunkerParams, MappedFile, resumed
from torpor.image.follow import DumpFollower, Followed
from torpor.image.packfile import RAW
from torpor.image.packs import WrittenGeneration, write_generation

MIB = 1 << 20


def image_bytes(seed: int) -> bytes:
    """~7 MiB: random pages, text, a zero run longer than the follower's window in the test,
    isolated zero pages, and a partial last page."""
    rnd = random.Random(seed)
    text = b"".join(b"key-%d=value-%d;" % (i, i * 7) for i in range(60_000))
    parts = [rnd.randbytes(2 * MIB), text[:MIB], bytes(2 * MIB)]
    for _ in range(16):
        parts += [rnd.randbytes(5 * PAGE), bytes(PAGE)]
    parts += [rnd.randbytes(2 * MIB), b"tail" * 300]
    return b"".join(parts)


FILES = {"pages-1.img": image_bytes(1), "pages-2.img": random.Random(2).randbytes(3 * MIB + 17),
         "pages-3.img": b"small" * 100, "pagemap-1.img": b"not followed" * 1000}


def append_slowly(path: Path, data: bytes, seed: int) -> None:
    """`data` into `path` in pieces of 1 byte to 600 KiB, as a dump appends."""
    rnd = random.Random(seed)
    with open(path, "wb", buffering=0) as f:
        pos = 0
        while pos < len(data):
            n = rnd.choice((1, 100, PAGE, 3 * PAGE + 5, 64 << 10, 600 << 10))
            f.write(data[pos:pos + n])
            pos += n
            if rnd.random() < 0.2:
                time.sleep(0.001)


def dump_followed(root: Path, files: dict[str, bytes], **kwargs: object) -> Followed:
    """The files written one after the other under root/criu while a follower follows."""
    criu = root / "criu"
    criu.mkdir(parents=True)
    with DumpFollower(str(criu), **kwargs) as follower:  # type: ignore[arg-type]
        for n, (name, data) in enumerate(files.items()):
            append_slowly(criu / name, data, n)
        wait_caught_up(follower, criu)
    assert follower.followed is not None
    return follower.followed


def wait_caught_up(follower: DumpFollower, criu: Path, timeout: float = 30) -> None:
    """Until the follower has cut every pages image as far as it can (no further window fits
    between its end and GUARD before the file's end), or `timeout`."""
    def behind() -> bool:
        for path in criu.glob("pages-*.img"):
            followed = follower.files.get(path.name)
            if followed is None:
                return True
            ready = path.stat().st_size // PAGE * PAGE - follow.GUARD - followed.end
            if ready >= min(follower.window, follower.params.max_size + PAGE):
                return True
        return False
    deadline = time.monotonic() + timeout
    while behind() and time.monotonic() < deadline:
        time.sleep(0.01)


def generation(root: Path, packs: Path, followed: Followed | None = None,
               **kwargs: object) -> WrittenGeneration:
    packs.mkdir()
    names = sorted(f"criu/{n}" for n in os.listdir(root / "criu"))
    return write_generation(str(root), names, str(packs), workers=2,
                            followed=followed.under("criu/") if followed else None,
                            **kwargs)  # type: ignore[arg-type]


def assert_same(a: WrittenGeneration, b: WrittenGeneration, packs_a: Path, packs_b: Path) -> None:
    assert a.index.to_json() == b.index.to_json()
    assert [p.digest for p in a.new_packs] == [p.digest for p in b.new_packs]
    for pack in a.new_packs:
        name = pack.digest.removeprefix("sha256:")
        assert (packs_a / name).read_bytes() == (packs_b / name).read_bytes()


@pytest.fixture(autouse=True)
def small_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window of 1 MiB, so that the zero run spans several and chunks straddle many; a guard
    of 256 KiB."""
    monkeypatch.setattr(follow, "WINDOW", MIB)
    monkeypatch.setattr(follow, "GUARD", 256 << 10)


def test_a_generation_from_a_followed_dump_is_the_one_written_without(tmp_path: Path) -> None:
    followed = dump_followed(tmp_path, FILES)
    assert set(followed.files) == {"pages-1.img", "pages-2.img", "pages-3.img"}
    # past the zero run longer than a window, to within its guard and a chunk of the end
    assert followed.files["pages-1.img"].end > len(FILES["pages-1.img"]) - follow.GUARD - MIB
    with_follower = generation(tmp_path, tmp_path / "packs-a", followed)
    without = generation(tmp_path, tmp_path / "packs-b")
    assert_same(with_follower, without, tmp_path / "packs-a", tmp_path / "packs-b")
    # most of the pages were cut and hashed during the "dump"
    assert with_follower.stats.followed_bytes > 5 * MIB
    assert without.stats.followed_bytes == 0


def test_what_it_made_is_dropped_where_it_is_not_the_same_file_or_cut(tmp_path: Path) -> None:
    followed = dump_followed(tmp_path, FILES)
    criu = tmp_path / "criu"
    # pages-1.img replaced by another file (another inode) with other bytes
    other = bytearray(FILES["pages-1.img"])
    other[4 * MIB:4 * MIB + 10] = b"0123456789"
    (criu / "new").write_bytes(bytes(other))
    os.replace(criu / "new", criu / "pages-1.img")
    with_follower = generation(tmp_path, tmp_path / "packs-a", followed)
    without = generation(tmp_path, tmp_path / "packs-b")
    assert_same(with_follower, without, tmp_path / "packs-a", tmp_path / "packs-b")
    assert with_follower.stats.followed_bytes <= len(FILES["pages-2.img"])
    # another chunking (a previous generation's): nothing taken
    params = ChunkerParams(64 << 10, 256 << 10, 1 << 20)
    other_cut = generation(tmp_path, tmp_path / "packs-c", followed, params=params)
    plain = generation(tmp_path, tmp_path / "packs-d", params=params)
    assert_same(other_cut, plain, tmp_path / "packs-c", tmp_path / "packs-d")
    assert other_cut.stats.followed_bytes == 0


@pytest.mark.parametrize("kwargs", [{"frame_budget": 0}, {"level": 3}], ids=["no-frames", "level"])
def test_frames_not_kept_or_of_another_level_are_made_again(tmp_path: Path,
                                                            kwargs: dict[str, int]) -> None:
    followed = dump_followed(tmp_path, FILES, **kwargs)
    with_follower = generation(tmp_path, tmp_path / "packs-a", followed)
    without = generation(tmp_path, tmp_path / "packs-b")
    assert_same(with_follower, without, tmp_path / "packs-a", tmp_path / "packs-b")
    assert with_follower.stats.followed_bytes > 5 * MIB


def test_a_follower_that_failed_leaves_nothing_to_take(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> list[object]:
        raise OSError("cannot cut")
    monkeypatch.setattr(follow, "cut", broken)
    criu = tmp_path / "criu"
    criu.mkdir()
    (criu / "pages-1.img").write_bytes(FILES["pages-1.img"])
    follower = DumpFollower(str(criu)).start()
    deadline = time.monotonic() + 10
    while follower.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(follower.error, OSError)
    assert follower.stop().files == {}


def test_spans_resumed_anywhere_are_the_whole_files_spans(tmp_path: Path) -> None:
    """The cut restarted at the end of any span of a prefix (the follower's windows) gives the
    spans of the whole file: chunks that straddle, zero runs split, the partial last page."""
    path = tmp_path / "pages-1.img"
    data = FILES["pages-1.img"]
    path.write_bytes(data)
    with MappedFile(str(path)) as mapped:
        whole = list(mapped.spans(DEFAULT_PARAMS))
        rnd = random.Random(5)
        for _ in range(20):
            end = rnd.randrange(0, len(data) // PAGE) * PAGE
            done = [s for s in whole if s.offset + s.length <= end]
            end = done[-1].offset + done[-1].length if done else 0
            zero = next((s for s in whole if s.zero and s.offset < end + 3 * PAGE
                         and s.offset + s.length > end + 3 * PAGE), None)
            if zero is not None and zero.offset >= end:  # split a zero run, as a window may
                done.append(type(zero)(zero.offset, end + 3 * PAGE - zero.offset, True))
                end += 3 * PAGE
            assert list(resumed(mapped, done, end, DEFAULT_PARAMS)) == whole


def test_its_threads_run_below_the_dump(tmp_path: Path) -> None:
    """NICE below the caller on the follower's own threads, the caller's left as it was."""
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: list[int] = []
    follower = DumpFollower(str(tmp_path))
    real = follower._open_new

    def open_new(now: float) -> None:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        real(now)
    follower._open_new = open_new  # type: ignore[method-assign]
    with follower:
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
    assert seen and seen[0] == min(19, before + nice.NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


def test_files_growing_at_once_and_many_files_few_descriptors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two pages images growing together, then six more one after the other: at most MAX_OPEN
    descriptors at once (a file done growing is closed), and the same generation."""
    monkeypatch.setattr(follow, "MAX_OPEN", 3)
    criu = tmp_path / "criu"
    criu.mkdir()
    files = {f"pages-{n}.img": random.Random(n).randbytes(MIB + n * PAGE) for n in range(8)}
    held: list[int] = []

    def ours() -> int:   # descriptors of files in criu/ (not of criu/ itself, which scandir holds)
        return sum(os.readlink(f"/proc/self/fd/{fd}").startswith(f"{criu}/")
                   for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))
    with DumpFollower(str(criu)) as follower:
        both = [threading.Thread(target=append_slowly, args=(criu / n, files[n], i))
                for i, n in enumerate(("pages-0.img", "pages-1.img"))]
        for t in both:
            t.start()
        for t in both:
            t.join()
        for n in range(2, 8):
            append_slowly(criu / f"pages-{n}.img", files[f"pages-{n}.img"], n)
            held.append(ours())
        held.append(ours())
        wait_caught_up(follower, criu)
        held.append(ours())
    assert follower.followed is not None
    assert max(held) <= 3 and ours() == 0
    assert len(follower.followed.files) == 8
    with_follower = generation(tmp_path, tmp_path / "packs-a", follower.followed)
    without = generation(tmp_path, tmp_path / "packs-b")
    assert_same(with_follower, without, tmp_path / "packs-a", tmp_path / "packs-b")
    assert with_follower.stats.followed_bytes > 2 * MIB


@pytest.mark.parametrize("change", ["appended", "rewritten", "truncated"])
def test_a_file_changed_after_the_follower_stopped_is_cut_whole(tmp_path: Path,
                                                               change: str) -> None:
    """Its size or mtime is not what it was when the follower stopped: nothing of it used."""
    followed = dump_followed(tmp_path, {"pages-1.img": FILES["pages-1.img"]})
    path = tmp_path / "criu" / "pages-1.img"
    time.sleep(0.02)   # the next mtime tick
    if change == "appended":
        with open(path, "ab") as f:
            f.write(b"more" * 1024)
    elif change == "rewritten":   # the same inode and size, other bytes
        other = bytearray(FILES["pages-1.img"])
        other[:PAGE] = bytes(range(256)) * 16
        with open(path, "r+b") as f:
            f.write(other)
    else:
        os.truncate(path, 2 * MIB)
    with_follower = generation(tmp_path, tmp_path / "packs-a", followed)
    without = generation(tmp_path, tmp_path / "packs-b")
    assert_same(with_follower, without, tmp_path / "packs-a", tmp_path / "packs-b")
    assert with_follower.stats.followed_bytes == 0


def test_a_file_that_shrinks_while_followed_is_cut_whole(tmp_path: Path) -> None:
    criu = tmp_path / "criu"
    criu.mkdir()
    path = criu / "pages-1.img"
    with DumpFollower(str(criu)) as follower:
        append_slowly(path, FILES["pages-1.img"][:3 * MIB], 1)
        deadline = time.monotonic() + 10
        while follower.followed_bytes == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.truncate(path, MIB)
        time.sleep(0.1)
        with open(path, "ab") as f:
            f.write(random.Random(9).randbytes(3 * MIB))
        time.sleep(0.1)
    assert follower.followed is not None and follower.followed.files["pages-1.img"].broken
    with_follower = generation(tmp_path, tmp_path / "packs-a", follower.followed)
    without = generation(tmp_path, tmp_path / "packs-b")
    assert_same(with_follower, without, tmp_path / "packs-a", tmp_path / "packs-b")
    assert with_follower.stats.followed_bytes == 0


def test_a_chunk_is_taken_only_at_its_offset_and_length() -> None:
    followed = follow.FollowedFile(1, 1)
    followed.chunks[0] = (PAGE * 8, bytes(32), RAW)
    assert followed.chunk(follow.Span(0, PAGE * 8)) == ("sha256:" + "00" * 32, RAW)
    assert followed.chunk(follow.Span(0, PAGE * 9)) is None
    assert followed.chunk(follow.Span(PAGE, PAGE * 8)) is None
