"""Memory images as content-defined chunks in packs: round trips, determinism, what a next
generation stores, and what a restore refuses. Pure (files under tmp_path), a few seconds.

The exact figures on 256 MiB and on real CRIU dumps are in bench/chunks.py; the bounds here
are generous.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import itertools
import json
import os
import random
from pathlib import Path

import pytest
import zstandard

from torpor.errors import DigestMismatch, ImageError, UnsafeArchive
from torpor.formats.chunk_index import ChunkIndex, PackIndex
from torpor.image import packs as packs_module
from torpor.image.chunker import DEFAULT_PARAMS, PAGE, ChunkerParams, MappedFile, Span, cut
from torpor.image.packfile import raw_frame_length, read_pack_index
from torpor.image.packs import (
    DEFAULT_SIZING,
    PackSizing,
    WrittenGeneration,
    known_chunks,
    known_chunks_in_packs,
    write_generation,
)
from torpor.image.reassemble import RestoreLimits, needed_packs, packs_in, rebuild

MIB = 1 << 20


@functools.cache
def random_bytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@functools.cache
def memory_like(seed: int) -> bytes:
    """24 MiB: random pages, text pages, a 4 MiB zero run, isolated zero pages, a partial page."""
    rnd = random.Random(seed)
    text = b"".join(b"key-%d=value-%d;" % (i, i * 7) for i in range(300_000))
    parts = [rnd.randbytes(12 * MIB), text[:4 * MIB], bytes(4 * MIB)]
    for _ in range(64):
        parts += [rnd.randbytes(3 * PAGE), bytes(PAGE)]
    parts.append(rnd.randbytes(4 * MIB - 64 * 4 * PAGE))
    parts.append(b"tail" * 300)  # 1200 bytes: a partial last page
    return b"".join(parts)


def write_files(root: Path, files: dict[str, bytes]) -> list[str]:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return sorted(files)


def generation(tmp_path: Path, label: str, files: dict[str, bytes],
               previous: WrittenGeneration | None = None, packs: Path | None = None,
               sizing: PackSizing = DEFAULT_SIZING, workers: int = 0,
               params: ChunkerParams = DEFAULT_PARAMS) -> WrittenGeneration:
    root = tmp_path / label
    root.mkdir()
    names = write_files(root, files)
    packs = packs or tmp_path / "packs"
    packs.mkdir(exist_ok=True)
    known = known_chunks(previous.index) if previous else None
    return write_generation(str(root), names, str(packs), known=known, sizing=sizing,
                            workers=workers, params=params)


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# --- the chunker ------------------------------------------------------------------------------

def test_spans_cover_the_file_at_page_boundaries_within_the_sizes() -> None:
    data = memory_like(1)
    params = ChunkerParams()
    spans = list(cut(data, params))
    assert spans[0].offset == 0 and sum(s.length for s in spans) == len(data)
    for a, b in itertools.pairwise(spans):
        assert a.offset + a.length == b.offset and not (a.zero and b.zero)
    for i, span in enumerate(spans):
        assert span.offset % PAGE == 0
        if span.zero:
            assert span.length % PAGE == 0 and not any(data[span.offset:span.offset + span.length])
            continue
        assert span.length <= params.max_size
        followed_by_zero = i + 1 < len(spans) and spans[i + 1].zero
        if i + 1 < len(spans) and not followed_by_zero:
            assert span.length >= params.min_size
    zero = sum(s.length for s in spans if s.zero)
    assert zero == 4 * MIB + 64 * PAGE  # every all-zero page, and nothing else
    full = [s.length for s in cut(random_bytes(16 * MIB, 1), params)]
    assert 0.75 * params.avg_size < sum(full) / len(full) < 1.25 * params.avg_size


def test_a_sparse_file_cuts_like_the_dense_one(tmp_path: Path) -> None:
    data = memory_like(1)
    dense = tmp_path / "dense"
    dense.write_bytes(data)
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.truncate(len(data))
        start = 12 * MIB + 4 * MIB  # the zero run stays a hole
        f.write(data[:start])
        f.seek(start + 4 * MIB)
        f.write(data[start + 4 * MIB:])
    with MappedFile(str(dense)) as a, MappedFile(str(sparse)) as b:
        assert list(a.spans()) == list(b.spans())
    tail_hole = tmp_path / "tail"
    with open(tail_hole, "wb") as f:
        f.write(b"x" * PAGE)
        f.truncate(3 * PAGE + 100)
    with MappedFile(str(tail_hole)) as t:
        assert list(t.spans()) == list(cut(tail_hole.read_bytes()))
        assert list(t.spans())[-1] == Span(3 * PAGE, 100)


# --- packs and the index ----------------------------------------------------------------------

def test_round_trip_rebuilds_every_file_exactly_with_holes(tmp_path: Path) -> None:
    files = {"pages-1.img": memory_like(1), "pages-2.img": random_bytes(3 * MIB + 17, 5),
             "sub/small.img": b"core", "empty.img": b""}
    gen = generation(tmp_path, "g1", files)
    assert [f.name for f in gen.index.files] == sorted(files)
    assert gen.stats.zero_bytes == 4 * MIB + 64 * PAGE
    index = ChunkIndex.from_json(gen.index.to_json())
    assert index == gen.index
    out = tmp_path / "out"
    out.mkdir()
    rebuilt = rebuild(index, packs_in(str(tmp_path / "packs")), str(out), workers=2)
    assert len(rebuilt.paths) == 4
    for name, data in files.items():
        path = out / name
        assert path.read_bytes() == data
        assert path.stat().st_mode & 0o777 == 0o600
    probe = tmp_path / "probe"
    with open(probe, "wb") as f:
        f.truncate(MIB)
    if probe.stat().st_blocks == 0:  # this filesystem keeps holes
        assert (out / "pages-1.img").stat().st_blocks * 512 <= len(files["pages-1.img"]) - 4 * MIB


def test_same_input_gives_identical_packs_and_index(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"pages-1.img": memory_like(1)}
    a = generation(tmp_path, "a", files, packs=tmp_path / "packs-a")
    b = generation(tmp_path, "b", files, packs=tmp_path / "packs-b", workers=1)
    monkeypatch.setattr(packs_module, "THREADED_BYTES", 0)   # hashed beside, as large files are
    c = generation(tmp_path, "c", files, packs=tmp_path / "packs-c")
    assert a.index.to_json() == b.index.to_json() == c.index.to_json()
    assert [p.digest for p in a.new_packs] == [p.digest for p in b.new_packs] == \
        [p.digest for p in c.new_packs]
    assert len(a.new_packs) > 1
    for pack in a.new_packs:
        hex_ = pack.digest.removeprefix("sha256:")
        data = (tmp_path / "packs-a" / hex_).read_bytes()
        assert data == (tmp_path / "packs-b" / hex_).read_bytes() and sha256(data) == pack.digest
        assert data == (tmp_path / "packs-c" / hex_).read_bytes()


def test_unchanged_content_stores_nothing_new(tmp_path: Path) -> None:
    files = {"pages-1.img": random_bytes(16 * MIB, 1)}
    g1 = generation(tmp_path, "g1", files)
    g2 = generation(tmp_path, "g2", files, previous=g1)
    assert g2.stats.new_bytes == 0 and g2.new_packs == ()
    assert g2.index.to_json() == g1.index.to_json()
    assert needed_packs(g2.index, {p.digest for p in g1.index.packs}) == []


def test_a_rewritten_region_stores_about_that_region(tmp_path: Path) -> None:
    data = bytearray(random_bytes(16 * MIB, 1))
    g1 = generation(tmp_path, "g1", {"pages-1.img": bytes(data)})
    region = len(data) // 10
    data[6 * MIB:6 * MIB + region] = random_bytes(region, 9)
    g2 = generation(tmp_path, "g2", {"pages-1.img": bytes(data)}, previous=g1)
    # the region, and at most a chunk on either side of it
    assert region <= g2.stats.new_bytes <= region + 2 * ChunkerParams().max_size
    assert g2.stats.new_pack_bytes <= region + 2 * ChunkerParams().max_size + 64 * 1024
    have = {p.digest for p in g1.index.packs}
    assert needed_packs(g2.index, have) == [p.digest for p in g2.new_packs]


def test_one_changed_page_changes_about_one_chunk(tmp_path: Path) -> None:
    data = bytearray(random_bytes(16 * MIB, 1))
    g1 = generation(tmp_path, "g1", {"pages-1.img": bytes(data)})
    data[5 * MIB + 123] ^= 0xFF
    g2 = generation(tmp_path, "g2", {"pages-1.img": bytes(data)}, previous=g1)
    assert 1 <= g2.stats.new_chunks <= 2
    assert g2.stats.new_bytes <= 2 * 1 * MIB


def test_inserted_and_moved_pages_still_match(tmp_path: Path) -> None:
    data = random_bytes(16 * MIB, 1)
    g1 = generation(tmp_path, "g1", {"pages-1.img": data})
    shifted = data[:MIB] + random_bytes(3 * PAGE, 12) + data[MIB:]
    g2 = generation(tmp_path, "g2", {"pages-1.img": shifted}, previous=g1)
    assert g2.stats.new_bytes <= 0.05 * len(data)
    moved = data[10 * MIB:] + data[:10 * MIB]  # the same pages at other offsets, other files
    g3 = generation(tmp_path, "g3", {"pages-9.img": moved[:7 * MIB], "pages-8.img": moved[7 * MIB:]},
                    previous=g1)
    assert g3.stats.new_bytes <= 0.1 * len(data)


def test_chunks_of_a_mostly_dead_pack_are_stored_again(tmp_path: Path) -> None:
    data = bytearray(random_bytes(16 * MIB, 1)[:8 * MIB])
    g1 = generation(tmp_path, "g1", {"pages-1.img": bytes(data)})
    biggest = max(range(len(g1.index.packs)), key=lambda n: g1.index.packs[n].size)
    first = g1.index.packs[biggest].digest
    at = list(itertools.accumulate((g1.index.chunks[e].plain_length for e in
                                    g1.index.files[0].extents), initial=0))
    held = [(at[n], g1.index.chunks[e].plain_length)
            for n, e in enumerate(g1.index.files[0].extents) if g1.index.chunks[e].pack == biggest]
    assert len(held) >= 5
    start, end = held[0][0], held[len(held) * 3 // 4][0]
    data[start:end] = random_bytes(end - start, 16)  # most of that pack no longer used
    g2 = generation(tmp_path, "g2", {"pages-1.img": bytes(data)}, previous=g1)
    assert first in {p.digest for p in g2.index.packs}
    g3 = generation(tmp_path, "g3", {"pages-1.img": bytes(data)}, previous=g2)
    assert first not in {p.digest for p in g3.index.packs}
    assert 0 < g3.stats.new_bytes <= sum(length for _, length in held)
    out = tmp_path / "out"
    out.mkdir()
    rebuild(g3.index, packs_in(str(tmp_path / "packs")), str(out))
    assert (out / "pages-1.img").read_bytes() == data


def test_zero_pages_are_recorded_not_stored(tmp_path: Path) -> None:
    gen = generation(tmp_path, "g1", {"pages-1.img": bytes(16 * MIB) + b"x" * PAGE + bytes(PAGE)})
    assert gen.stats.zero_bytes == 16 * MIB + PAGE
    assert gen.stats.new_bytes == PAGE
    assert sum(p.size for p in gen.new_packs) < 2 * PAGE
    assert gen.index.files[0].extents == (-16 * MIB, 0, -PAGE)


def test_each_pack_carries_its_own_index_and_is_a_zstd_stream(tmp_path: Path) -> None:
    data = memory_like(1)
    gen = generation(tmp_path, "g1", {"pages-1.img": data})
    paths = [str(tmp_path / "packs" / p.digest.removeprefix("sha256:")) for p in gen.new_packs]
    assert known_chunks_in_packs(paths) == known_chunks(gen.index)
    plain = b""
    for path in paths:
        with open(path, "rb") as f:
            plain += zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()
    chunks = {c.digest: c for c in gen.index.chunks}
    assert len(plain) == sum(c.plain_length for c in chunks.values())
    assert sum(len(read_pack_index(p).chunks) for p in paths) == len(chunks)
    # the pack index stays at version 1 whatever the chunk index's version: packs written before
    # and after are the same bytes, so generations keep sharing them
    with open(paths[0], "rb") as f:
        assert b'"mediaType":"application/vnd.torpor.checkpoint.pack-index.v1+json","version":1' \
            in f.read()
    doc = json.loads(PackIndex(read_pack_index(paths[0]).chunks).to_json())
    doc["version"] = 2
    with pytest.raises(ImageError, match="pack index version 2 is not known"):
        PackIndex.from_json(json.dumps(doc).encode(), os.path.getsize(paths[0]))


def test_standalone_generations_of_nearly_the_same_files_share_their_packs(tmp_path: Path) -> None:
    """Packs end where the content says: a few pages changed near the start, and small files
    that change every time, leave the other packs as they were (no previous generation)."""
    data = bytearray(random_bytes(4 * MIB, 3))
    params, sizing = ChunkerParams(4096, 16384, 65536), PackSizing(128 << 10, 128 << 10)
    one = {"a-core.img": b"time 1", "pages-1.img": bytes(data), "z-stats.img": b"took 1"}
    for page in (3, 9, 40):
        data[page * PAGE:page * PAGE + 8] = b"changed!"
    two = {"a-core.img": b"time 2", "pages-1.img": bytes(data), "z-stats.img": b"took 2"}
    g1 = generation(tmp_path, "g1", one, params=params, sizing=sizing)
    g2 = generation(tmp_path, "g2", two, params=params, sizing=sizing)
    assert len(g2.new_packs) >= 16
    shared = {p.digest for p in g1.new_packs} & {p.digest for p in g2.new_packs}
    assert sum(p.size for p in g2.new_packs if p.digest in shared) >= \
        0.9 * sum(p.size for p in g2.new_packs)
    assert max(p.size for p in g2.new_packs) <= 4 * (128 << 10) + 65536 + 4096


def test_chunks_that_do_not_compress_are_stored_raw(tmp_path: Path) -> None:
    """Random bytes take a raw zstd frame (no compression spent, memcpy to read back); text is
    compressed; the pack stays a zstd stream and both restore."""
    text = b"".join(b"key-%d=value-%d;" % (i, i) for i in range(20_000))[:256 << 10]
    files = {"random.img": random_bytes(MIB, 4), "text.img": text}
    gen = generation(tmp_path, "g1", files)
    chunks = {f.name: [gen.index.chunks[e] for e in f.extents] for f in gen.index.files}
    assert all(c.length == raw_frame_length(c.plain_length) for c in chunks["random.img"])
    assert all(c.length < 0.5 * c.plain_length for c in chunks["text.img"])
    out = tmp_path / "out"
    out.mkdir()
    rebuild(gen.index, packs_in(str(tmp_path / "packs")), str(out))
    for name, data in files.items():
        assert (out / name).read_bytes() == data


# --- what a restore refuses -------------------------------------------------------------------

def test_a_damaged_pack_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    gen = generation(tmp_path, "g1", {"pages-1.img": memory_like(1), "a/b.img": b"x" * 5000})
    chunk = max(gen.index.chunks, key=lambda c: c.length)
    pack = tmp_path / "packs" / gen.index.packs[chunk.pack].digest.removeprefix("sha256:")
    blob = bytearray(pack.read_bytes())
    blob[chunk.offset + chunk.length // 2] ^= 0x01
    pack.write_bytes(bytes(blob))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DigestMismatch, match="damaged"):
        rebuild(gen.index, packs_in(str(tmp_path / "packs")), str(out))
    assert list(out.iterdir()) == []
    pack.write_bytes(bytes(blob[:-1]))
    with pytest.raises(DigestMismatch, match="bytes, not the"):
        rebuild(gen.index, packs_in(str(tmp_path / "packs")), str(out))
    pack.unlink()
    with pytest.raises(ImageError, match="missing"):
        rebuild(gen.index, packs_in(str(tmp_path / "packs")), str(out))


def test_an_index_of_version_1_still_restores(tmp_path: Path) -> None:
    """Checkpoints written before version 2 list each file's sha256 too: they read as the same
    index and rebuild the same files (the sha256 is checked for form, as before, not used)."""
    data = {"pages-1.img": random_bytes(16 * MIB, 1)[:3 * MIB], "pages-2.img": b"x" * 5000}
    gen = generation(tmp_path, "g1", data)
    old = json.loads(gen.index.to_json())
    assert old["version"] == 2 and all("digest" not in f for f in old["files"])
    old["version"] = 1
    for f in old["files"]:
        f["digest"] = "sha256:" + hashlib.sha256(data[f["name"]]).hexdigest()
    index = ChunkIndex.from_json(json.dumps(old).encode())
    assert index == gen.index
    out = tmp_path / "out"
    out.mkdir()
    rebuild(index, packs_in(str(tmp_path / "packs")), str(out))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == data
    for bad in ("sha256:xyz", None):
        if bad is None:
            del old["files"][0]["digest"]
        else:
            old["files"][0]["digest"] = bad
        with pytest.raises(ImageError, match=r"not a sha256 digest|missing"):
            ChunkIndex.from_json(json.dumps(old).encode())


def test_a_hostile_index_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    gen = generation(tmp_path, "g1", {"pages-1.img": random_bytes(16 * MIB, 1)[:2 * MIB]})
    good = json.loads(gen.index.to_json())

    def refused(change: dict[str, object], error: type[Exception], match: str) -> None:
        doc = json.loads(json.dumps(good))
        for key, value in change.items():
            target = doc
            *path, last = key.split(".")
            for part in path:
                target = target[int(part)] if part.isdigit() else target[part]
            target[int(last) if last.isdigit() else last] = value
        with pytest.raises(error, match=match):
            ChunkIndex.from_json(json.dumps(doc).encode())

    refused({"version": 3}, ImageError, "version 3 is not known")
    for version in (2.0, 1.0, True, "2", None):
        refused({"version": version}, ImageError, "is not known")
    refused({"files.0.digest": "sha256:" + "0" * 64}, ImageError, "unexpected")
    refused({"files.0.name": "../etc/passwd"}, UnsafeArchive, "plain relative")
    refused({"files.0.name": "/etc/passwd"}, UnsafeArchive, "plain relative")
    refused({"files.0.size": 1}, ImageError, "add up")
    refused({"files.0.extents": [99]}, ImageError, "not listed")
    refused({"chunks.0.2": 1 << 40}, ImageError, "outside its pack")
    refused({"packs.0.0": "sha256:xyz"}, ImageError, "not a sha256 digest")
    refused({"surprise": 1}, ImageError, "unexpected")
    with pytest.raises(ImageError, match="over the limit"):
        ChunkIndex.from_json(gen.index.to_json(), max_bytes=100)
    huge = json.loads(gen.index.to_json())
    huge["files"][0]["extents"].append(-(1 << 50))
    huge["files"][0]["size"] += 1 << 50
    index = ChunkIndex.from_json(json.dumps(huge).encode())
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ImageError, match="over this node's limits"):
        rebuild(index, packs_in(str(tmp_path / "packs")), str(out), limits=RestoreLimits())
    assert list(out.iterdir()) == []


def test_a_rebuild_beside_the_download_waits_for_each_pack(tmp_path: Path) -> None:
    """The packs arrive while the files are rebuilt (a registry pull beside it): the rebuild
    takes each when it is in place, and comes out exact; a download that fails ends the rebuild
    with its error, nothing of it left."""
    import shutil
    import threading

    from torpor.registry.arrivals import Arrivals

    files = {"pages-1.img": random_bytes(3 * MIB, 11), "pages-2.img": random_bytes(2 * MIB, 12)}
    gen = generation(tmp_path, "g1", files)
    index = ChunkIndex.from_json(gen.index.to_json())
    assert len(index.packs) > 1
    stored, arriving = tmp_path / "packs", tmp_path / "arriving"
    arriving.mkdir()
    arrivals = Arrivals()

    def download() -> None:    # one pack at a time, the last well after the rebuild began
        for pack in index.packs:
            name = pack.digest.removeprefix("sha256:")
            shutil.copy(stored / name, arriving / f".{name}")
            (arriving / f".{name}").rename(arriving / name)
            arrivals.arrived(pack.digest)
    out = tmp_path / "out"
    out.mkdir()
    later = threading.Timer(0.2, download)
    later.start()
    rebuild(index, packs_in(str(arriving)), str(out), workers=2, arrivals=arrivals)
    later.join()
    for name, data in files.items():
        assert (out / name).read_bytes() == data

    failing, out2 = Arrivals(), tmp_path / "out2"
    out2.mkdir()
    threading.Timer(0.1, failing.failed, [OSError("the registry went away")]).start()
    with pytest.raises(ImageError, match="did not arrive: the registry went away"):
        rebuild(index, packs_in(str(tmp_path / "nowhere")), str(out2), workers=2,
                arrivals=failing)
    assert list(out2.iterdir()) == []


def test_a_rebuild_waiting_for_packs_stops_at_once_when_interrupted(tmp_path: Path) -> None:
    """Ctrl-C or the deadline in the main thread while the rebuild waits for packs that do not
    come: it ends at once (its waiters woken, the download told to stop), nothing left."""
    import signal
    import threading
    import time

    from torpor.registry.arrivals import Arrivals

    files = {"pages-1.img": random_bytes(2 * MIB, 13)}
    index = ChunkIndex.from_json(generation(tmp_path, "g1", files).index.to_json())
    arrivals = Arrivals()
    rescue = threading.Timer(10, lambda: [arrivals.arrived(p.digest) for p in index.packs])
    rescue.start()                   # were it to hang: the packs come after 10 s

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    out = tmp_path / "out"
    out.mkdir()
    started = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            rebuild(index, packs_in(str(tmp_path / "packs")), str(out), workers=2,
                    arrivals=arrivals)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        rescue.cancel()
    assert time.monotonic() - started < 3
    assert arrivals.stopped.is_set()
    assert list(out.iterdir()) == []


def test_arrivals_say_why_a_pack_will_not_come() -> None:
    from torpor.registry.arrivals import Arrivals

    gone = Arrivals(["sha256:a"])
    gone.failed(OSError("connection refused"))
    with pytest.raises(ImageError, match="did not arrive: connection refused"):
        gone.wait("sha256:a")        # in, then the download failed: its blobs may be gone
    done = Arrivals(["sha256:a"])
    done.finished()
    done.wait("sha256:a")
    with pytest.raises(ImageError, match="not among the layers downloaded"):
        done.wait("sha256:b")


def test_a_pack_the_store_held_before_the_download_is_checked_chunk_by_chunk(
        tmp_path: Path) -> None:
    """Only a pack this download checked whole skips its chunks' sha256: one the store held
    already (told as `here`, not hashed by this restore) is read as any pack is, and a
    damaged byte in it is refused."""
    from torpor.registry.arrivals import Arrivals

    files = {"pages-1.img": random_bytes(2 * MIB, 14)}
    index = ChunkIndex.from_json(generation(tmp_path, "g1", files).index.to_json())
    pack = index.packs[0]
    stored = tmp_path / "packs" / pack.digest.removeprefix("sha256:")
    damaged = bytearray(stored.read_bytes())
    damaged[index.chunks[0].offset + 100] ^= 1
    stored.write_bytes(damaged)
    arrivals = Arrivals([p.digest for p in index.packs])
    arrivals.finished()
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DigestMismatch, match="damaged"):
        rebuild(index, packs_in(str(tmp_path / "packs")), str(out), workers=2,
                arrivals=arrivals)
    assert list(out.iterdir()) == []


def test_a_vouched_chunk_still_has_its_length_and_size_checked() -> None:
    """A frame its pack's own index vouches for is not hashed again, but its length and
    content size are still the record's; a record the index does not list is hashed."""
    import zstandard

    from torpor.formats.chunk_index import ChunkRecord
    from torpor.image.packfile import compressor, raw_frame
    from torpor.image.reassemble import decode_chunk

    plain = random_bytes(256 << 10, 15)
    raw = b"".join(bytes(p) for p in raw_frame(memoryview(plain)))
    digest = "sha256:" + hashlib.sha256(plain).hexdigest()
    zstd = zstandard.ZstdDecompressor()
    record = ChunkRecord(digest, 0, 0, len(raw), len(plain))
    vouched = {(digest, 0, len(raw), len(plain))}
    assert decode_chunk(memoryview(raw), record, "sha256:p", zstd, vouched) == plain
    with pytest.raises(DigestMismatch):
        decode_chunk(raw[:-1], record, "sha256:p", zstd, vouched)
    other = ChunkRecord("sha256:" + "0" * 64, 0, 0, len(raw), len(plain))
    with pytest.raises(DigestMismatch):
        decode_chunk(raw, other, "sha256:p", zstd, vouched)   # not what the pack says is there
    squeezed = compressor().compress(b"a" * 4096)
    short = ChunkRecord(digest, 0, 0, len(squeezed), 4095)
    with pytest.raises(DigestMismatch):
        decode_chunk(squeezed, short, "sha256:p", zstd, {(digest, 0, len(squeezed), 4095)})


@pytest.mark.parametrize("length", [1, 4096, (128 << 10) - 1, 128 << 10, (128 << 10) + 1,
                                    256 << 10, (384 << 10) + 4096, 1 << 20])
def test_where_a_raw_frames_bytes_lie_in_its_pack_and_any_other_frame_is_not_read_so(
        tmp_path: Path, length: int) -> None:
    """`raw_spans` gives the ranges of the pack that hold a raw frame's bytes (what a lazy
    restore sends from the file), at block edges included; a frame whose header or any block
    header differs from torpor's is not read as raw."""
    from torpor.image.packfile import raw_frame, raw_spans

    plain = random_bytes(length, length)
    frame = b"".join(bytes(p) for p in raw_frame(memoryview(plain)))
    path = tmp_path / "pack"
    path.write_bytes(b"x" * 77 + frame + b"y" * 5)
    fd = os.open(path, os.O_RDONLY)
    try:
        spans = raw_spans(fd, 77, length)
        assert spans is not None
        assert b"".join(os.pread(fd, n, at) for at, n in spans) == plain
        headers = [at - 3 for at, _ in spans] + [77 + i for i in range(9)]
        for at in headers:
            data = bytearray(path.read_bytes())
            data[at] ^= 0x01
            (tmp_path / "forged").write_bytes(data)
            forged = os.open(tmp_path / "forged", os.O_RDONLY)
            try:
                assert raw_spans(forged, 77, length) is None, at
            finally:
                os.close(forged)
        assert raw_spans(fd, 77, length + 1) is None
    finally:
        os.close(fd)


def misdirected(tmp_path: Path) -> tuple[ChunkIndex, bytes]:
    """A pack of sixteen 64 KiB random chunks (raw frames, all one length) whose chunk index
    points the second chunk's record at the first chunk's frame: the pack and its digest are
    sound, the index is not (as sound_indexes.py fears of a stored index)."""
    import dataclasses

    from torpor.image.chunker import ChunkerParams

    data = random_bytes(MIB, 16)
    fixed = ChunkerParams(min_size=64 << 10, avg_size=64 << 10, max_size=64 << 10)
    index = ChunkIndex.from_json(
        generation(tmp_path, "g1", {"pages-1.img": data}, params=fixed).index.to_json())
    first, second = (index.chunks[n] for n in index.files[0].extents[:2])
    assert (first.pack, first.length) == (second.pack, second.length)
    chunks = list(index.chunks)
    chunks[index.files[0].extents[1]] = dataclasses.replace(second, offset=first.offset)
    return dataclasses.replace(index, chunks=tuple(chunks)), data


def test_a_record_pointing_at_another_frame_of_a_checked_pack_is_refused(
        tmp_path: Path) -> None:
    """The pack's digest was checked whole by this restore, so its chunks are not hashed again,
    but only those its own index lists where the chunk index says: a record pointing at
    another frame of the same length is hashed, and refused, in a rebuild and in a lazy
    restore's page source alike."""
    from torpor.lazy.chunks import ChunkSource
    from torpor.registry.arrivals import Arrivals

    index, _ = misdirected(tmp_path)
    arrivals = Arrivals()
    for pack in index.packs:
        arrivals.arrived(pack.digest, str(tmp_path / "packs" / pack.digest.removeprefix("sha256:")))
    arrivals.finished()
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DigestMismatch):
        rebuild(index, packs_in(str(tmp_path / "packs")), str(out), workers=2, arrivals=arrivals)
    assert list(out.iterdir()) == []
    source = ChunkSource(index, lambda digest, size: None, None, lambda: float("inf"))
    source.follow(arrivals)
    with pytest.raises(DigestMismatch):
        source.read(index.files[0], 0, 256 << 10)
    source.close()


def test_a_page_source_reads_ahead_from_packs_at_hand_and_refuses_a_damaged_chunk(
        tmp_path: Path) -> None:
    """A lazy restore of an image this node holds: behind each request, the next chunks are
    read and hashed on the fetchers while CRIU places the pages before them, and a chunk
    damaged on disk, read ahead, is still refused when CRIU asks for it."""
    import time

    from torpor.lazy.chunks import AHEAD_AT_HAND, ChunkSource

    data = random_bytes(24 * MIB, 7)
    gen = generation(tmp_path, "g1", {"pages-1.img": data})
    record = gen.index.files[0]
    at, damaged_at = 0, None
    for n in record.extents:   # the chunk holding byte 8 MiB, inside the first window
        chunk = gen.index.chunks[n]
        if at <= 8 * MIB < at + chunk.plain_length:
            pack = tmp_path / "packs" / gen.index.packs[chunk.pack].digest.removeprefix("sha256:")
            blob = bytearray(pack.read_bytes())
            blob[chunk.offset + chunk.length // 2] ^= 0x01
            pack.write_bytes(bytes(blob))
            damaged_at = at
        at += chunk.plain_length
    assert damaged_at is not None and 8 * MIB < AHEAD_AT_HAND
    # the first read ends where the second pack begins: that pack, in the store but not yet
    # opened, counts as at hand too (else the window would be READ_AHEAD, the whole file)
    at, first_pack = 0, gen.index.chunks[record.extents[0]].pack
    for n in record.extents:
        if n >= 0 and gen.index.chunks[n].pack != first_pack:
            break
        at += gen.index.chunks[n].plain_length if n >= 0 else -n
    assert at > 0 and at + AHEAD_AT_HAND + MIB < len(data)
    gc.collect()   # an earlier test's failure traceback may still hold a pack open
    fds = len(os.listdir("/proc/self/fd"))
    source = ChunkSource(gen.index, lambda digest, size: str(
        tmp_path / "packs" / digest.removeprefix("sha256:")), None, lambda: float("inf"))
    try:
        assert b"".join(source.read(record, 0, at)) == data[:at]
        deadline = time.monotonic() + 10
        while source.counts.local_bytes < AHEAD_AT_HAND and time.monotonic() < deadline:
            time.sleep(0.01)   # no read asks for them: the fetchers read ahead
        assert source.counts.local_bytes >= AHEAD_AT_HAND
        time.sleep(0.2)   # and no further than its window (and the chunk that crosses it)
        assert source.counts.local_bytes < at + AHEAD_AT_HAND + MIB
        assert b"".join(source.read(record, 4 * MIB, MIB)) == data[4 * MIB:5 * MIB]
        with pytest.raises(DigestMismatch, match="damaged"):
            source.read(record, damaged_at, PAGE)
        source.read(record, 16 * MIB, MIB)   # more read ahead, running as it closes
    finally:
        source.close()
    deadline = time.monotonic() + 5
    while len(os.listdir("/proc/self/fd")) != fds and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(os.listdir("/proc/self/fd")) == fds   # no pack left open behind it
