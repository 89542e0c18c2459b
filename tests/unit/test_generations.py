"""Generations of checkpoint images, the pure parts: the stream chunker cuts as the file
chunker does, the chunk index blob round-trips and is refused when damaged, tar layers are the
same bytes whatever the files' times and modes, the previous generation is found in a store in
the documented order, an estimate record round-trips, a process's pages are read as CRIU would
dump them."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import random
from pathlib import Path

import pytest

from torpor.capture import memory
from torpor.errors import FormatError, ImageError
from torpor.formats import annotations as ann
from torpor.formats import mediatypes as mt
from torpor.formats.estimate import Estimate, EstimatePart
from torpor.formats.oci import Descriptor
from torpor.image import layers
from torpor.image.build import compress_index
from torpor.image.chunker import PAGE, StreamChunker, cut
from torpor.image.generations import find_previous, params_of
from torpor.image.packs import write_generation
from torpor.image.store import Store
from torpor.image.unpack import read_index
from torpor.registry.layout import Layout

MIB = 1 << 20


def pages_with_zero_runs(seed: int) -> bytes:
    rnd = random.Random(seed)
    parts = [rnd.randbytes(3 * MIB), bytes(5 * PAGE), rnd.randbytes(MIB + PAGE), bytes(PAGE),
             b"ab" * (MIB // 2), rnd.randbytes(7 * PAGE)]
    return b"".join(parts)


def test_the_stream_chunker_cuts_as_the_file_chunker() -> None:
    data = pages_with_zero_runs(3)
    expected = [("sha256:" + hashlib.sha256(data[s.offset:s.offset + s.length]).hexdigest(),
                 s.length) for s in cut(data) if not s.zero]
    stream = StreamChunker(keep_data=True)
    got = []
    for at in range(0, len(data), PAGE):
        ended = stream.page(data[at:at + PAGE])
        if ended:
            got.append(ended)
    ended = stream.finish()
    if ended:
        got.append(ended)
    assert [(d, n) for d, n, _ in got] == expected
    assert all(hashlib.sha256(b).hexdigest() == d.split(":")[1] for d, _, b in got if b)
    assert stream.zero_bytes == 6 * PAGE
    with pytest.raises(ValueError):
        stream.page(b"short")


def test_the_chunk_index_blob_round_trips_and_is_refused_when_damaged(tmp_path: Path) -> None:
    root = tmp_path / "files"
    (root / "criu").mkdir(parents=True)
    (root / "criu" / "pages-1.img").write_bytes(pages_with_zero_runs(4))
    (tmp_path / "packs").mkdir()
    generation = write_generation(str(root), ["criu/pages-1.img"], str(tmp_path / "packs"))
    blob = compress_index(generation.index)
    assert blob == compress_index(generation.index)  # deterministic
    assert len(blob) < 0.75 * len(generation.index.to_json())
    layout = Layout(tmp_path / "layout")
    layout.create()
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    layout.write_small(digest, blob, durable=False)
    assert read_index(layout, Descriptor(mt.CHUNK_INDEX_ZSTD, digest, len(blob))) == \
        generation.index
    assert params_of(generation.index).avg_size == generation.index.chunking.avg_size
    bad = b"\x28\xb5\x2f\xfd" + b"not zstd at all"
    bad_digest = "sha256:" + hashlib.sha256(bad).hexdigest()
    layout.write_small(bad_digest, bad, durable=False)
    with pytest.raises(ImageError, match="not a zstd frame"):
        read_index(layout, Descriptor(mt.CHUNK_INDEX_ZSTD, bad_digest, len(bad)))
    with pytest.raises(ImageError):  # a wrong size in the descriptor
        read_index(layout, Descriptor(mt.CHUNK_INDEX_ZSTD, digest, len(blob) - 1))


def test_tar_layers_depend_on_names_and_bytes_only(tmp_path: Path) -> None:
    digests = []
    for run, (mode, mtime) in enumerate([(0o600, 1_000_000), (0o644, 2_000_000)]):
        root = tmp_path / f"run{run}"
        (root / "torpor").mkdir(parents=True)
        for name, data in (("torpor/state.json", b"{}"), ("torpor/devshm.tar", b"x" * 70_000)):
            path = root / name
            path.write_bytes(data)
            path.chmod(mode)
            os.utime(path, (mtime, mtime))
        pieces = layers.pieces_of(str(root), ["torpor/devshm.tar", "torpor/state.json"], 64 << 10)
        written = layers.write_layer(pieces, str(tmp_path / f"layer{run}"))
        digests.append(written.digest)
    assert digests[0] == digests[1]


def store_entry(store_root: Path, ref: str, container: str, created: str) -> str:
    """An image entry whose index says who and when (enough for find_previous)."""
    entry = store_root / "images" / hashlib.sha256(ref.encode()).hexdigest()[:20]
    layout = Layout(entry / "layout")
    layout.create()
    (entry / "ref").write_text(ref)
    body = json.dumps({"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": [],
                       "annotations": {ann.CONTAINER: container, ann.CREATED: created}}).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    layout.write_small(digest, body, durable=False)
    layout.tag(Descriptor(mt.OCI_INDEX, digest, len(body)), "t")
    return digest


def test_the_previous_generation_is_found_in_the_documented_order(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    restored_from = store_entry(tmp_path, "reg/a/old:1", "web", "2026-01-01T00:00:00Z")
    store_entry(tmp_path, "reg/a/web:2", "web", "2026-01-03T00:00:00Z")
    store_entry(tmp_path, "reg/a/web:1", "web", "2026-01-02T00:00:00Z")
    store_entry(tmp_path, "reg/b/other:9", "db", "2026-01-04T00:00:00Z")

    def found(**kw: object) -> str | None:
        args: dict[str, object] = {"index_digest": None, "ref": None, "container_id": "x"}
        args.update(kw)
        candidates = find_previous(store, **args)  # type: ignore[arg-type]
        return candidates[0][0].ref if candidates else None

    assert found(index_digest=restored_from, ref="reg/a/web:1", container_id="web") == \
        "reg/a/old:1"
    assert found(ref="reg/a/web:1", container_id="web") == "reg/a/web:1"
    assert found(ref="reg/c/new:1", container_id="web") == "reg/a/web:2"  # the newest of web
    assert found(ref="reg/b/other:10", container_id="cache") == "reg/b/other:9"
    assert found(ref="reg/z/none:1", container_id="cache") is None
    # an image's own claims (container, creation date) choose only among sound indexes: the
    # restored-from image and the same reference may be verified, the others must be known
    claims = find_previous(store, index_digest=restored_from, ref="reg/a/web:1",
                           container_id="web")
    assert [(c.ref, verify) for c, verify in claims] == [
        ("reg/a/old:1", True), ("reg/a/web:1", True), ("reg/a/web:2", False)]


def test_an_estimate_round_trips_and_refuses_other_formats() -> None:
    made = Estimate("web", "default", "2026-01-01T00:00:00Z", "sha256:" + "a" * 64, "reg/a:1",
                    (EstimatePart("memory", 100, 90, 10, "chunks"),
                     EstimatePart("rootfs", 5, 4, 0)), 0.5)
    again = Estimate.loads(made.dumps(), "estimate")
    assert again == made and again.full_bytes == 94 and again.new_bytes == 10
    with pytest.raises(FormatError, match="format"):
        Estimate.loads(json.dumps({"format": "torpor.estimate.v9"}).encode(), "estimate")


def zero_pages_and_hits(wanted: set[bytes]) -> tuple[int, int]:
    zero = hits = 0
    blank = bytes(PAGE)
    firsts = {page[:64] for page in wanted}   # a page's head first: no copy of every page
    for page in memory.dump_pages(os.getpid()):
        if page == blank:
            zero += 1
        elif page[:64] in firsts and page.tobytes() in wanted:
            hits += 1
    return zero, hits


@pytest.mark.skipif(os.geteuid() != 0, reason="page frame numbers need root")
def test_a_process_pages_are_read_as_criu_dumps_them() -> None:
    """Our own process: a private buffer we wrote is there, page for page; pages only read
    (mapped to the zero page) are not, pages written with zeros are."""
    n = 2048
    private = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    buffer = mmap.mmap(-1, 64 * PAGE, flags=private)
    marker = random.Random(7).randbytes(64 * PAGE)
    buffer.write(marker)
    wanted = {marker[i:i + PAGE] for i in range(0, len(marker), PAGE)}
    zero_before, hits = zero_pages_and_hits(wanted)
    assert hits >= 64  # (a copy of a page elsewhere may be aligned too)
    read_only = mmap.mmap(-1, n * PAGE, flags=private)
    assert sum(read_only[i * PAGE] for i in range(n)) == 0  # maps the zero page n times
    zero_read, _ = zero_pages_and_hits(wanted)
    written = mmap.mmap(-1, n * PAGE, flags=private)
    for i in range(n):
        written[i * PAGE] = 0  # a written page of zeros: CRIU dumps it
    zero_written, _ = zero_pages_and_hits(wanted)
    assert zero_read - zero_before < n // 4
    assert zero_written - zero_read >= n * 3 // 4  # (other pages change meanwhile)
    for m in (buffer, read_only, written):
        m.close()


def test_durations_read_as_users_write_them() -> None:
    from torpor.cli.durations import parse_duration

    assert parse_duration("90") == 90 and parse_duration("10m") == 600
    assert parse_duration("1h30m") == 5400 and parse_duration("7d") == 7 * 86400
    for bad in ("", "10 minutes", "m", "1x", "-5m"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_a_series_tags_generations_by_time_and_moves_one_tag() -> None:
    from torpor.ops.schedule import Series

    series = Series.of("reg:5000/team/web:ckpt")
    assert series.generation(0) == "reg:5000/team/web:ckpt-19700101-000000"
    assert series.moving == "reg:5000/team/web:ckpt"
    assert series.pattern.fullmatch("ckpt-20261201-120000")
    assert not series.pattern.fullmatch("ckpt") and not series.pattern.fullmatch("other-1")
    untagged = Series.of("reg.example/team/web")
    assert untagged.generation(0) == "reg.example/team/web:19700101-000000"
    assert untagged.moving == "reg.example/team/web:latest"
    assert not untagged.pattern.fullmatch("latest")


def test_retention_keeps_the_newest_and_the_recent() -> None:
    from torpor.errors import ConfigError
    from torpor.ops.prune import Retention, chosen_to_keep, created_epoch

    made = {f"g{d}": f"2026-01-{d:02d}T00:00:00Z" for d in range(1, 8)}
    now = created_epoch("2026-01-08T00:00:00Z")

    def kept(retention: Retention) -> list[str]:
        return sorted(chosen_to_keep(list(made), made.__getitem__, retention, now))

    assert kept(Retention(keep=2)) == ["g6", "g7"]
    assert kept(Retention(older_than_s=3.5 * 86400)) == ["g5", "g6", "g7"]
    assert kept(Retention(older_than_s=60)) == ["g7"]  # the newest stays
    assert kept(Retention(keep=0, older_than_s=60)) == []
    assert kept(Retention(keep=1, older_than_s=2.5 * 86400)) == ["g6", "g7"]
    with pytest.raises(ConfigError):
        Retention()


def test_only_a_chunk_index_whose_records_are_true_is_found_sound(tmp_path: Path) -> None:
    """A next generation reuses its basis's chunk records unread: an index that lists a chunk
    where its pack holds other bytes (here: two records' places swapped, all digests right) is
    found out by reading the chunks back, and only a sound one is recorded."""
    from dataclasses import replace

    from torpor.image import sound_indexes
    from torpor.image.packs import known_chunks

    root = tmp_path / "files"
    (root / "criu").mkdir(parents=True)
    (root / "criu" / "pages-1.img").write_bytes(pages_with_zero_runs(5))
    packs_dir = tmp_path / "packs"
    packs_dir.mkdir()
    index = write_generation(str(root), ["criu/pages-1.img"], str(packs_dir)).index
    packs = {p.digest: packs_dir / p.digest.split(":")[1] for p in index.packs}
    assert sound_indexes.verify(index, packs, known_chunks(index).keys())
    a, b = index.chunks[0], index.chunks[1]
    lying = replace(index, chunks=(replace(a, offset=b.offset, length=b.length),
                                   replace(b, offset=a.offset, length=a.length),
                                   *index.chunks[2:]))
    assert not sound_indexes.verify(lying, packs, known_chunks(lying).keys())
    assert not sound_indexes.verify(index, {}, known_chunks(index).keys())  # packs not held
    digest = "sha256:" + hashlib.sha256(compress_index(index)).hexdigest()
    assert not sound_indexes.recorded(tmp_path, digest)
    sound_indexes.record(tmp_path, digest)
    assert sound_indexes.recorded(tmp_path, digest)
    assert not sound_indexes.recorded(tmp_path, "sha256:../../etc")


def index_bomb(mib: int) -> bytes:
    """A well-formed chunk index of `mib` MiB: one file of zero runs, every extent one page."""
    n = (mib << 20) // 6
    head = json.dumps({
        "mediaType": mt.CHUNK_INDEX, "version": 1,
        "chunking": {"algorithm": "page-crc32-v1", "page_size": 4096, "min_size": 32768,
                     "avg_size": 131072, "max_size": 524288, "compression": "zstd", "level": 3},
        "packs": [], "chunks": [],
        "files": [{"name": "criu/pages-1.img", "size": 4096 * n, "digest": "sha256:" + "0" * 64,
                   "extents": []}]}, separators=(",", ":")).encode()
    at = head.index(b'"extents":[') + len(b'"extents":[')
    return head[:at] + b"-4096," * (n - 1) + b"-4096" + head[at:]   # json.dumps took 0.24 s


def test_a_small_chunk_index_layer_that_unpacks_to_much_is_refused_at_once(tmp_path: Path) -> None:
    """1.7 KB of zstd that unpack to 16 MiB of valid JSON (and one that does not say how much it
    unpacks to): refused before the JSON is read, in little time and memory."""
    import time
    import tracemalloc

    import zstandard

    from torpor.image.unpack import INDEX_FLOOR, ImageLimits, index_limit

    layout = Layout(tmp_path / "layout")
    layout.create()
    bomb = index_bomb(16)
    for says_size in (True, False):
        blob = zstandard.ZstdCompressor(level=9, write_content_size=says_size).compress(bomb)
        assert len(blob) < 2000
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        layout.write_small(digest, blob, durable=False)
        tracemalloc.start()
        started = time.monotonic()
        with pytest.raises(ImageError, match=r"unpacks to .* may unpack to"):
            read_index(layout, Descriptor(mt.CHUNK_INDEX_ZSTD, digest, len(blob)))
        seconds = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert seconds < 0.25 and peak < 4 * INDEX_FLOOR, (says_size, seconds, peak)
    assert index_limit(2000) == INDEX_FLOOR and index_limit(10 << 20, 64 << 20) == 64 << 20
    from torpor.config import Config

    assert ImageLimits.of(Config({"restore": {"max_chunk_index_bytes": 5 << 20}})) \
        .max_chunk_index_bytes == 5 << 20
