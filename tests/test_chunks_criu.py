"""Real CRIU and chunked memory images: a process dumped, its images written as chunks in
packs and rebuilt with its zero pages as holes, comes back from the rebuilt directory with
the same memory; a second dump of an idle process adds almost nothing new."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from torpor.formats.chunk_index import PackRecord
from torpor.image import follow
from torpor.image.early_packs import EarlyPacker
from torpor.image.packs import PackSizing, known_chunks, write_generation
from torpor.image.reassemble import packs_in, rebuild

from .support import ecosystem

pytestmark = pytest.mark.real
MIB = 1 << 20
PAGE = 4096

HOLDER = """
import hashlib, os, signal, sys, time
size = int(sys.argv[2]) if len(sys.argv) > 2 else 48 << 20
blob = bytearray(os.urandom(size))
blob[size // 3:2 * size // 3] = bytes(size // 3)   # written zeros: CRIU dumps these pages
def report(*_):
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(hashlib.sha256(blob).hexdigest())
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
signal.signal(signal.SIGUSR1, report)
report()
while True:
    time.sleep(0.2)
"""


def criu() -> str:
    path = ecosystem.which("criu")
    assert path, "criu is missing: run `make deps`"
    return path


def wait_for(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)
    return path.read_text()


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] == "Z"
    except FileNotFoundError:
        return True


def end(pid: int) -> None:
    """End the process this test started (or restored), by pid."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def holder(tmp_path: Path, request: pytest.FixtureRequest
           ) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A process holding 48 MiB (or the test's `holding` mark's bytes): random, a third zeros."""
    report = tmp_path / "report"
    holding = request.node.get_closest_marker("holding")
    size = str(holding.args[0]) if holding else str(48 * MIB)
    with open(tmp_path / "holder.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(report), size],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    try:
        wait_for(report)
        yield proc, report
    finally:
        if proc.poll() is None:
            end(proc.pid)
        proc.wait()


def dump(pid: int, directory: Path, *extra: str, mkdir: bool = True) -> list[str]:
    if mkdir:
        directory.mkdir()
    subprocess.run([criu(), "dump", "-t", str(pid), "-D", str(directory), "--shell-job",
                    "-o", "dump.log", *extra], check=True, capture_output=True)
    return sorted(p.name for p in directory.iterdir() if p.name != "dump.log")


def test_a_process_restores_from_rebuilt_sparse_images(
        tmp_path: Path, holder: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, report = holder
    pid = proc.pid
    memory = report.read_text()
    names = dump(pid, tmp_path / "dump")  # CRIU ends the process here
    proc.wait()                           # and its pid is free for the restore
    packs = tmp_path / "packs"
    packs.mkdir()
    gen = write_generation(str(tmp_path / "dump"), names, str(packs))
    # the written zeros start a malloc header past a page: all but one of their pages whole
    assert gen.stats.zero_bytes >= 16 * MIB - PAGE
    assert gen.stats.new_pack_bytes < gen.stats.total_bytes - 15 * MIB
    rebuilt = tmp_path / "rebuilt"
    rebuilt.mkdir()
    rebuild(gen.index, packs_in(str(packs)), str(rebuilt))
    pages = next(rebuilt / n for n in names if n.startswith("pages-"))
    assert pages.stat().st_blocks * 512 < pages.stat().st_size - 15 * MIB  # holes, not zeros
    for name in names:
        original = (tmp_path / "dump" / name).read_bytes()
        assert hashlib.sha256((rebuilt / name).read_bytes()).digest() == \
            hashlib.sha256(original).digest()
    report.unlink()
    subprocess.run([criu(), "restore", "-D", str(rebuilt), "--shell-job", "-d",
                    "-o", "restore.log"], check=True, capture_output=True)
    try:  # the restored process, with the pid it had
        os.kill(pid, signal.SIGUSR1)
        assert wait_for(report) == memory
    finally:
        end(pid)


def test_a_second_dump_of_an_idle_process_is_almost_all_reused(
        tmp_path: Path, holder: tuple[subprocess.Popen[bytes], Path]) -> None:
    pid = holder[0].pid
    packs = tmp_path / "packs"
    packs.mkdir()
    first = dump(pid, tmp_path / "d1", "--leave-running")
    g1 = write_generation(str(tmp_path / "d1"), first, str(packs))
    time.sleep(1)
    second = dump(pid, tmp_path / "d2", "--leave-running")
    g2 = write_generation(str(tmp_path / "d2"), second, str(packs), known=known_chunks(g1.index))
    sent = g2.stats.new_pack_bytes + len(g2.index.to_json())
    assert sent <= 0.05 * (g1.stats.new_pack_bytes + len(g1.index.to_json()))


def test_pages_cut_while_criu_writes_them_give_the_generation_cut_after(
        tmp_path: Path, holder: tuple[subprocess.Popen[bytes], Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A DumpFollower reading a real `criu dump` as it writes (image/follow.py): the chunks it
    hashed then are the chunks of the finished images, so the generation is the same bytes."""
    monkeypatch.setattr(follow, "WINDOW", MIB)   # read in small steps, to keep up with CRIU
    monkeypatch.setattr(follow, "GUARD", 0)      # and up to its end: this dump takes ~50 ms
    pid = holder[0].pid
    directory = tmp_path / "dump"
    directory.mkdir()
    with follow.DumpFollower(str(directory)) as follower:
        names = dump(pid, directory, "--leave-running", mkdir=False)
    followed = follower.followed
    assert followed is not None and followed.bytes_followed() > 0, "nothing followed"
    packs_a, packs_b = tmp_path / "packs-a", tmp_path / "packs-b"
    packs_a.mkdir()
    packs_b.mkdir()
    with_follower = write_generation(str(directory), names, str(packs_a), followed=followed)
    without = write_generation(str(directory), names, str(packs_b))
    assert with_follower.index.to_json() == without.index.to_json()
    assert sorted(os.listdir(packs_a)) == sorted(os.listdir(packs_b))
    print(f"followed during the dump: {followed.bytes_followed() >> 20} MiB of "
          f"{with_follower.stats.total_bytes >> 20} MiB")


@pytest.mark.holding(384 * MIB)
def test_pages_packed_while_criu_writes_them_are_the_generations_packs(
        tmp_path: Path, holder: tuple[subprocess.Popen[bytes], Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An EarlyPacker beside the follower during a real `criu dump` (image/early_packs.py),
    pack sizes scaled down (settled at 8 MiB, not 2 GiB): the packs it closed during the dump
    are handed out then, and the generation that takes them is the one written without."""
    monkeypatch.setattr(follow, "WINDOW", MIB)
    monkeypatch.setattr(follow, "GUARD", 0)
    sizing = PackSizing(smallest=256 << 10, largest=MIB, per_file=8)
    directory = tmp_path / "dump"
    directory.mkdir()
    handed: list[PackRecord] = []
    with follow.DumpFollower(str(directory)) as follower:
        with EarlyPacker(follower, str(tmp_path / "packs-a"), {}, follower.level, sizing,
                         handed.append) as packer:
            names = dump(holder[0].pid, directory, "--leave-running", mkdir=False)
        during = list(handed)
    assert follower.followed is not None and packer.packed is not None
    packs_a, packs_b = tmp_path / "packs-a", tmp_path / "packs-b"
    packs_b.mkdir()
    try:
        with_early = write_generation(str(directory), names, str(packs_a), sizing=sizing,
                                      followed=follower.followed, early=packer.packed.files)
    finally:
        packer.packed.abandon()
    without = write_generation(str(directory), names, str(packs_b), sizing=sizing)
    assert with_early.index.to_json() == without.index.to_json()
    assert sorted(p.name for p in packs_b.iterdir()) == \
        sorted(p.name for p in packs_a.iterdir() if p.is_file())
    print(f"packed during the dump: {with_early.stats.early_bytes >> 20} MiB of "
          f"{with_early.stats.total_bytes >> 20} MiB, {len(during)} packs handed out")
    assert with_early.stats.early_bytes > 0 and during, "nothing packed during the dump"
