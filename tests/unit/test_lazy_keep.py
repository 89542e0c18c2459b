"""A lazy restore's packs downloaded whole behind the workload: CRIU's background reads wait
for their pack to be whole and checked, a page fault reads what the download has written so
far (its chunk checked) or goes by range at once, a failed download leaves the rest to range
requests, and what is kept is whole."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import random
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from torpor.errors import DigestMismatch, ImageError
from torpor.formats.chunk_index import ChunkIndex, FileRecord
from torpor.image.packfile import raw_frame_length
from torpor.image.packs import PackSizing, write_generation
from torpor.lazy import chunks, keep, pieces
from torpor.lazy.chunks import ChunkSource
from torpor.lazy.keep import PackDownload
from torpor.registry.arrivals import Arrivals
from torpor.registry.layout import Layout

MIB = 1 << 20
Built = tuple[bytes, ChunkIndex, Path]   # a pages file's bytes, its index, its packs


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """A pages file of random bytes, cut into packs of at most 4 MiB (read only: shared)."""
    root = tmp_path_factory.mktemp("generation")
    data = random.Random(21).randbytes(6 * MIB)   # fixed: pack 0 holds several chunks
    (root / "criu").mkdir()
    (root / "criu" / "pages-1.img").write_bytes(data)
    packs = root / "packs"
    packs.mkdir()
    written = write_generation(str(root), ["criu/pages-1.img"], str(packs),
                               sizing=PackSizing(smallest=MIB, largest=MIB, per_file=1))
    assert len(written.index.packs) >= 2
    return data, written.index, packs


def pack_file(packs: Path, digest: str) -> Path:
    return packs / digest.split(":")[1]


class Registry:
    """Range requests answered from the packs, counted (the remote side of ChunkSource)."""

    def __init__(self, packs: Path) -> None:
        self.packs, self.asked = packs, []

    def __call__(self, digest: str, offset: int, length: int) -> bytes:
        self.asked.append((digest, offset, length))
        with open(pack_file(self.packs, digest), "rb") as f:
            f.seek(offset)
            return f.read(length)


def first_pack_bytes(index: ChunkIndex, covering: int) -> int:
    """How many of the first pack's bytes hold the chunks of the file's first `covering`
    bytes (all of them in that pack)."""
    covered, needed = 0, []
    for extent in index.files[0].extents:
        if covered >= covering:
            break
        needed.append(index.chunks[extent])
        covered += index.chunks[extent].plain_length
    assert {c.pack for c in needed} == {0}
    return max(c.offset + c.length for c in needed)


def downloading(index: ChunkIndex, packs: Path, into: Path, arrivals: Arrivals,
                gate: threading.Event | None = None, tamper: bool = False,
                covering: int = 64 << 10, held: threading.Event | None = None
                ) -> threading.Thread:
    """The packs written into `into` piece by piece as a pull writes them, told to `arrivals`,
    each told `arrived` once its digest is checked (a pack that fails it fails the download);
    with `gate`, the first pack stops once it holds the chunks of the file's first `covering`
    bytes (and sets `held`), until the gate is set."""
    pause_at, paused = first_pack_bytes(index, covering), []
    def run() -> None:
        for number, pack in enumerate(index.packs):
            data = bytearray(pack_file(packs, pack.digest).read_bytes())
            if tamper:
                data[100] ^= 1
            partial = into / f".{number}.partial"
            with open(partial, "wb") as out:
                for at in range(0, len(data), 4096):
                    out.write(data[at:at + 4096])
                    out.flush()
                    arrivals.growing(pack.digest, str(partial), min(len(data), at + 4096))
                    if gate is not None and number == 0 and at + 4096 >= pause_at \
                            and not paused:
                        paused.append(at)
                        if held is not None:
                            held.set()
                        gate.wait()
            if "sha256:" + hashlib.sha256(data).hexdigest() != pack.digest:
                partial.unlink()
                arrivals.failed(DigestMismatch(f"pack {pack.digest} is damaged"))
                return
            final = into / pack.digest.split(":")[1]
            os.replace(partial, final)
            arrivals.arrived(pack.digest, str(final))
        arrivals.finished()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def nowhere(digest: str, size: int) -> str | None:
    """No pack is on this node."""
    return None


def following(index: ChunkIndex, registry: Registry, arrivals: Arrivals) -> ChunkSource:
    """A page source with no pack on this node, reading the packs' download of `arrivals`,
    else `registry` by range, without a deadline."""
    source = ChunkSource(index, nowhere, registry, lambda: float("inf"))
    source.follow(arrivals)
    return source


def read(source: ChunkSource, record: FileRecord, offset: int, length: int) -> bytes:
    return b"".join(pieces.contents(piece) for piece in source.read(record, offset, length))


def test_background_reads_wait_for_their_pack_whole_and_faults_do_not(
        tmp_path: Path, built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    """The download holds the first pack once it has written every chunk the background read
    needs: that read still waits, for the pack to be whole and checked."""
    monkeypatch.setattr(chunks, "STALL_S", 30.0)   # a loaded machine: no range in between
    data, index, packs = built
    registry, arrivals = Registry(packs), Arrivals()
    source = following(index, registry, arrivals)
    into = tmp_path / "download"
    into.mkdir()
    gate = threading.Event()
    record = index.files[0]
    after = index.chunks[record.extents[0]].plain_length   # past the chunk the fault reads
    assert index.chunks[record.extents[1]].pack == 0
    held = threading.Event()
    thread = downloading(index, packs, into, arrivals, gate, covering=after + (64 << 10),
                         held=held)
    background: list[bytes] = []
    reader = threading.Thread(
        target=lambda: background.append(read(source, record, after, 64 << 10)))
    try:
        assert held.wait(10), "the download did not reach its pause"
        assert read(source, record, 0, 4096) == data[:4096]   # a fault: the half-written pack
        assert registry.asked == []
        reader.start()   # CRIU's background transfer: not from a pack not yet checked
        reader.join(0.3)
        assert reader.is_alive() and not background
        fault_at = len(data) - 4096    # a page fault in the last pack, not downloaded yet
        assert read(source, record, fault_at, 4096) == data[fault_at:]
        assert [a[0] for a in registry.asked] == [index.packs[-1].digest]
    finally:
        gate.set()
        thread.join()
        if reader.ident is not None:
            reader.join(5)
    assert background == [data[after:after + (64 << 10)]]
    assert read(source, record, 0, len(data)) == data
    assert [a[0] for a in registry.asked] == [index.packs[-1].digest]   # the rest downloaded
    assert source.counts.streamed_bytes > 0
    source.close()


def test_a_tampered_byte_in_the_download_is_refused_before_use(tmp_path: Path, built: Built) -> None:
    """Read from the pack's file as it comes, a chunk is checked against its own sha256; and
    the pack, whole, fails its digest, so nothing reads it as checked."""
    _, index, packs = built
    arrivals = Arrivals()
    source = following(index, Registry(packs), arrivals)
    into = tmp_path / "download"
    into.mkdir()
    gate = threading.Event()
    held = threading.Event()
    thread = downloading(index, packs, into, arrivals, gate, tamper=True, held=held)
    try:
        assert held.wait(10), "the download did not reach its pause"
        with pytest.raises(DigestMismatch):
            source.read(index.files[0], 0, 4096)
    finally:
        gate.set()
        thread.join()
    assert arrivals.first_error is not None and not arrivals.checked(index.packs[0].digest)
    assert not list(into.iterdir())
    source.close()


def test_a_failed_download_leaves_the_rest_to_range_requests(tmp_path: Path, built: Built) -> None:
    data, index, packs = built
    registry, arrivals = Registry(packs), Arrivals()
    source = following(index, registry, arrivals)
    threading.Timer(0.05, arrivals.failed, [ImageError("the registry went")]).start()
    started = time.monotonic()
    assert read(source, index.files[0], 0, 1 << 20) == data[:1 << 20] and registry.asked
    assert time.monotonic() - started < 5
    source.close()


def test_the_download_keeps_every_pack_and_links_those_already_here(tmp_path: Path, built: Built) -> None:
    _, index, packs = built
    layout = tmp_path / "layout"
    held = index.packs[0]

    def local(digest: str, size: int) -> str | None:
        return str(pack_file(packs, digest)) if digest == held.digest else None

    fetched: list[Sequence[str]] = []

    def fetch(digests: Sequence[str], arrivals: Arrivals) -> None:
        fetched.append(digests)
        blobs = Layout(layout)
        for digest in digests:
            blobs.blob_dir(digest)
            data = pack_file(packs, digest).read_bytes()
            blobs.blob_path(digest).write_bytes(data)
            arrivals.growing(digest, str(blobs.blob_path(digest)), len(data))
            arrivals.arrived(digest, str(blobs.blob_path(digest)))

    download = PackDownload(str(layout), index.packs, local, fetch)
    download.start()
    assert download.finish() == sum(p.size for p in index.packs[1:])
    assert fetched == [[p.digest for p in index.packs[1:]]]   # in order, the held one not
    for pack in index.packs:
        assert Layout(layout).blob_path(pack.digest).read_bytes() == \
            pack_file(packs, pack.digest).read_bytes()


def test_a_failed_or_cancelled_download_is_said_at_finish(tmp_path: Path, built: Built) -> None:
    _, index, _packs = built

    def broken(digests: Sequence[str], arrivals: Arrivals) -> None:
        raise ImageError("nothing is listening at the registry")

    download = PackDownload(str(tmp_path / "layout"), index.packs, nowhere, broken)
    download.start()
    with pytest.raises(ImageError, match="nothing is listening"):
        download.finish()

    def slow(digests: Sequence[str], arrivals: Arrivals) -> None:
        while not arrivals.stopped.is_set():
            time.sleep(0.01)
        raise ImageError("the download was stopped")

    download = PackDownload(str(tmp_path / "layout"), index.packs, nowhere, slow)
    download.start()
    started = time.monotonic()
    download.cancel()
    assert time.monotonic() - started < 2
    with pytest.raises(ImageError, match="stopped"):
        download.finish()


def test_a_download_that_stalls_is_passed_by_range_requests(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        built: Built) -> None:
    data, index, packs = built
    monkeypatch.setattr(chunks, "STALL_S", 0.05)
    registry = Registry(packs)
    # a download that never writes a byte, nor fails
    source = following(index, registry, Arrivals(partial=True))
    started = time.monotonic()
    assert read(source, index.files[0], 0, 1 << 20) == data[:1 << 20] and registry.asked
    assert 0.04 < time.monotonic() - started < 3
    source.close()


def test_a_stuck_download_is_given_up_at_the_deadline_and_on_cancel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        built: Built) -> None:
    _, index, _packs = built
    monkeypatch.setattr(keep, "CANCEL_WAIT_S", 0.05)
    release = threading.Event()

    def stuck(digests: Sequence[str], arrivals: Arrivals) -> None:
        arrivals.growing(digests[0], str(tmp_path / "partial"), 4096)
        release.wait(30)   # a read the network never answers: it sees no stop

    download = PackDownload(str(tmp_path / "layout"), index.packs, nowhere, stuck)
    download.start()
    started = time.monotonic()
    with pytest.raises(ImageError, match="did not end before the restore's deadline"):
        download.finish(time.monotonic() + 0.05)
    assert time.monotonic() - started < 2
    assert download.bytes_written == 4096
    started = time.monotonic()
    download.cancel()   # again, as the restore's clean-up does: it does not hang either
    assert time.monotonic() - started < 1
    release.set()


def test_a_pack_whose_own_download_stalls_is_passed_while_others_move(
        tmp_path: Path, built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first pack's connection hangs (its retries tell the same size again) while another
    pack keeps coming: CRIU's background read of the first pack stops waiting after
    PACK_STALL_S rather than WAIT_S, and takes what the hung download's file holds, chunk
    checked, or, where it holds too little, a range request."""
    monkeypatch.setattr(chunks, "PACK_STALL_S", 0.2)
    monkeypatch.setattr(chunks, "WAIT_S", 8.0)   # broken, this fails instead of hanging
    data, index, packs = built
    first, other = index.packs[0], index.packs[1]
    needs = first_pack_bytes(index, 64 << 10)   # the first pack's bytes the read needs
    held = tmp_path / "held"   # the hung download's file: what it had written
    held.write_bytes(pack_file(packs, first.digest).read_bytes()[:needs])
    for written, expect_range in ((4096, True), (needs, False)):
        registry, arrivals = Registry(packs), Arrivals()
        source = following(index, registry, arrivals)
        stop = threading.Event()

        def download(arrivals: Arrivals, stop: threading.Event, written: int) -> None:
            while not stop.wait(0.05):
                arrivals.growing(first.digest, str(held), written)      # a retry: no growth
                arrivals.growing(other.digest, str(tmp_path / "other"), 4096)   # still moving

        thread = threading.Thread(target=download, args=(arrivals, stop, written), daemon=True)
        thread.start()
        started = time.monotonic()
        try:
            assert read(source, index.files[0], 0, 64 << 10) == data[:64 << 10]
        finally:
            stop.set()
            thread.join()
        assert 0.15 < time.monotonic() - started < chunks.PACK_STALL_S + 3
        assert [a[0] for a in registry.asked] == ([first.digest] if expect_range else [])
        source.close()


def test_a_slow_pack_that_still_grows_is_waited_for(
        tmp_path: Path, built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow connection tells its progress seldom (a MiB at a time): a pack that grew within
    PACK_STALL_S is still waited for, whole, while another moves; nothing by range."""
    monkeypatch.setattr(chunks, "PACK_STALL_S", 0.3)
    monkeypatch.setattr(chunks, "WAIT_S", 8.0)
    data, index, packs = built
    first, other = index.packs[0], index.packs[1]
    registry, arrivals = Registry(packs), Arrivals()
    source = following(index, registry, arrivals)
    whole = tmp_path / first.digest.split(":")[1]
    stop = threading.Event()

    def download() -> None:
        for step in range(1, 6):   # 0.08 s between its reports, 0.4 s in all
            arrivals.growing(first.digest, str(tmp_path / "partial"), step * 4096)
            arrivals.growing(other.digest, str(tmp_path / "other"), step * 4096)
            if stop.wait(0.08):
                return
        whole.write_bytes(pack_file(packs, first.digest).read_bytes())
        arrivals.arrived(first.digest, str(whole))

    thread = threading.Thread(target=download, daemon=True)
    thread.start()
    try:
        assert read(source, index.files[0], 0, 64 << 10) == data[:64 << 10]
    finally:
        stop.set()
        thread.join()
    assert registry.asked == []
    source.close()


def sent_through_a_socket(answer: list[pieces.Piece], timeout: float | None = None) -> bytes:
    """What CRIU's end of the page server's socket receives for `answer` (sent with
    `timeout`: the socket non-blocking underneath)."""
    ours, theirs = socket.socketpair()
    ours.settimeout(timeout)
    received = bytearray()

    def receive() -> None:
        while piece := theirs.recv(1 << 20):
            received.extend(piece)

    thread = threading.Thread(target=receive)
    thread.start()
    try:
        pieces.send(ours, answer)
    finally:
        ours.close()
        thread.join()
        theirs.close()
    return bytes(received)


def test_raw_chunks_of_a_checked_pack_go_out_from_its_file_byte_for_byte(
        tmp_path: Path, built: Built) -> None:
    """Once the download has brought every pack whole and checked it, memory that did not
    compress is answered as ranges of the packs' files (sent by the kernel, never read into
    torpor), and CRIU's end receives exactly the pages, whatever the range's edges."""
    data, index, packs = built
    registry, arrivals = Registry(packs), Arrivals()
    source = following(index, registry, arrivals)
    into = tmp_path / "download"
    into.mkdir()
    downloading(index, packs, into, arrivals).join()
    record = index.files[0]
    for offset, length in ((0, len(data)), (4096, 3 * MIB), (5000, len(data) - 9000)):
        answer = source.read(record, offset, length)
        assert all(isinstance(piece, pieces.FileRange) for piece in answer)
        assert sent_through_a_socket(answer) == data[offset:offset + length]
    assert registry.asked == []
    source.close()


def test_a_raw_frame_with_a_forged_block_header_is_refused_though_its_pack_checks(
        tmp_path: Path, built: Built) -> None:
    """A pack made with a raw chunk's block header altered, its digest then taken of what it
    holds (a signer's own damage): the download checks it whole, its own index still lists
    the chunk, yet its bytes are not sent as they lie; the chunk is decoded, and refused."""
    _, index, packs = built
    record = index.files[0]
    chunk = index.chunks[record.extents[0]]
    pack = index.packs[chunk.pack]
    assert chunk.length == raw_frame_length(chunk.plain_length)   # random memory: raw
    forged = bytearray(pack_file(packs, pack.digest).read_bytes())
    forged[chunk.offset + 9] ^= 0x08   # the first block says one byte more
    digest = "sha256:" + hashlib.sha256(forged).hexdigest()
    path = tmp_path / digest.split(":")[1]
    path.write_bytes(forged)
    all_packs = list(index.packs)
    all_packs[chunk.pack] = dataclasses.replace(pack, digest=digest)
    index = dataclasses.replace(index, packs=tuple(all_packs))
    arrivals = Arrivals()
    arrivals.arrived(digest, str(path))
    source = following(index, Registry(packs), arrivals)
    with pytest.raises(DigestMismatch):
        source.read(record, 0, 4096)
    source.close()


def test_raw_and_compressed_chunks_of_one_pack_come_out_in_order(tmp_path: Path) -> None:
    """Memory that compresses and memory that does not, side by side in the same packs: once
    checked, the raw chunks go out from the file and the others decoded, in one answer, and
    the pages arrive exactly, through a socket with a timeout too."""
    rng = random.Random(7)
    data = b"".join(rng.randbytes(256 << 10) if n % 2 else (b"torpor %d " % n) * 26000
                    for n in range(16))[:4 * MIB]
    root = tmp_path / "generation"
    (root / "criu").mkdir(parents=True)
    (root / "criu" / "pages-1.img").write_bytes(data)
    (tmp_path / "packs").mkdir()
    index = write_generation(str(root), ["criu/pages-1.img"], str(tmp_path / "packs"),
                             sizing=PackSizing(smallest=MIB, largest=MIB, per_file=1)).index
    raw = {n for n, c in enumerate(index.chunks) if c.length == raw_frame_length(c.plain_length)}
    assert raw and len(raw) < len(index.chunks)
    arrivals = Arrivals()
    for pack in index.packs:
        arrivals.arrived(pack.digest, str(pack_file(tmp_path / "packs", pack.digest)))
    source = following(index, Registry(tmp_path / "packs"), arrivals)
    answer = source.read(index.files[0], 4096, len(data) - 8192)
    assert {type(piece) for piece in answer} == {pieces.FileRange, memoryview}
    assert sent_through_a_socket(answer, timeout=5.0) == data[4096:-4096]
    source.close()


def test_an_answer_still_going_out_when_the_source_closes_reads_its_own_pack(
        tmp_path: Path, built: Built) -> None:
    """A pack's file stays open while a piece of an answer names it, even past the page
    source's close (no other file can take its descriptor number), and closes after."""
    data, index, packs = built
    arrivals = Arrivals()
    for pack in index.packs:
        arrivals.arrived(pack.digest, str(pack_file(packs, pack.digest)))
    source = following(index, Registry(packs), arrivals)
    answer = source.read(index.files[0], 0, MIB)
    fds = {piece.file.fd for piece in answer if isinstance(piece, pieces.FileRange)}
    assert fds
    source.close()
    others = [os.open(pack_file(packs, p.digest), os.O_RDONLY) for p in index.packs]
    try:
        assert sent_through_a_socket(answer) == data[:MIB]
    finally:
        for fd in others:
            os.close(fd)
    del answer
    for fd in fds:   # closed: gone, or another file's now
        with contextlib.suppress(FileNotFoundError):
            assert not os.readlink(f"/proc/self/fd/{fd}").startswith(str(packs))
