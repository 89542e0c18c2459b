"""One lazy restore: the CRIU images rebuilt but for the lazy pages, then their page source.

`LazyMemory.rebuild` writes every file of the chunk index except the lazy pages: CRIU's small
images whole, each pages-N.img as a sparse file holding only the runs CRIU's restore reads
itself (pagemap.py); the chunks come from `ChunkSource` (this node's packs, or ranges of the
registry's), verified. `LazyMemory.start` then starts, before the task is created:
 1. `criu lazy-pages --page-server --ps-socket N` on one end of a socket pair, in its own
    session (a Ctrl-C of torpor must not reach it), its socket `lazy-pages.socket` in the
    restore's work directory, where torpor-runc finds it and adds `--lazy-pages` to
    `runc restore`;
 2. the guard (guard.py), holding a copy of torpor's end, told the container's cgroup;
 3. the page server (server.py) on a thread.
`LazyPages.running(pid)` tells the guard the restored init; `wait` returns once every page is
placed, or kills the container (frozen first) and raises: a workload cannot run on with pages
missing. `LazyPages.close` closes torpor's end only after that, and reaps the daemon.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from torpor.capture.freezer import Cgroup
from torpor.errors import DeadlineExceeded, ImageError, RestoreError, TorporError
from torpor.formats import names
from torpor.formats.chunk_index import ChunkIndex, FileRecord
from torpor.image import reassemble
from torpor.lazy import pagemap
from torpor.lazy.chunks import ChunkSource, LocalPack, RemoteRange
from torpor.lazy.guard import kill_cgroup
from torpor.lazy.keep import Fetch, PackDownload
from torpor.lazy.pieces import Piece
from torpor.lazy.server import PageServer

SOCKET = names.LAZY_PAGES_SOCKET  # where CRIU's restore finds the daemon (its work directory)
LOG = "lazy-pages.log"
_PAGES = re.compile(r"pages-\d+\.img\Z")
START_S = 10.0
TRACK_S = 1.0
SEND_BUFFER = 4 << 20   # the kernel caps it at net.core.wmem_max (and doubles it)


@dataclass(frozen=True)
class LazyResult:
    lazy_bytes: int          # what arrived after the workload ran
    complete_s: float        # the last page placed, after the page source started
    remote_bytes: int        # fetched from the registry by range requests
    local_bytes: int         # read from packs on this node
    streamed_bytes: int = 0  # read from the packs' download as it came


class LazyMemory:
    def __init__(self, local: LocalPack, remote: RemoteRange | None,
                 download: tuple[str, Fetch] | None = None, digest: str = "") -> None:
        """`download`: the layout the packs go into whole, behind the workload, and how they
        are fetched there (keep.py); the restore stores the image once all of it is here.
        `digest`: the image's index digest (what progress records name it by)."""
        self._local, self._remote, self._download_to = local, remote, download
        self.digest = digest
        self.download: PackDownload | None = None
        self.give_up_at = float("inf")   # set by the caller once it knows the deadline
        self.source: ChunkSource | None = None
        self.pagemaps: dict[int, pagemap.Pagemap] = {}
        self.files: dict[str, FileRecord] = {}
        self.criu_dir = ""

    @property
    def lazy_bytes(self) -> int:
        return sum(p.lazy_bytes for p in self.pagemaps.values())

    def rebuild(self, index: ChunkIndex, target: str,
                limits: reassemble.RestoreLimits | None = None) -> None:
        """The chunk index's files under `target`, the lazy pages left out (holes)."""
        if self._download_to is not None and self._remote is not None:
            layout, fetch = self._download_to
            self.download = PackDownload(layout, index.packs, self._local, fetch)
        source = self.source = ChunkSource(index, self._local, self._remote,
                                           lambda: self.give_up_at)
        pages = tuple(f for f in index.files if _PAGES.match(f.name.rsplit("/", 1)[-1]))
        others = tuple(f for f in index.files if f not in pages)
        reassemble.rebuild(replace(index, files=others), None, target, limits=limits,
                           chunks=source.chunk_of)
        self.criu_dir = os.path.join(target, names.CRIU_DIR)
        self.pagemaps = pagemap.read(self.criu_dir)
        self.files = {f.name.rsplit("/", 1)[-1]: f for f in pages}
        eager: dict[str, list[tuple[int, int]]] = {}
        for pm in self.pagemaps.values():
            record = self.files.get(pm.pages_file)
            held = sum(r.pages for r in pm.runs) * pagemap.PAGE
            if record is None or record.size != held or pm.pages_file in eager:
                raise ImageError(f"pagemap of process {pm.pid} does not match "
                                 f"{pm.pages_file} in the chunk index: no lazy restore of it")
            eager[pm.pages_file] = pm.eager()

        def ranges(record: FileRecord) -> list[tuple[int, int]] | None:
            return eager.get(record.name.rsplit("/", 1)[-1])   # shared memory's: whole

        reassemble.rebuild(replace(index, files=pages), None, target, limits=limits,
                           chunks=source.chunk_of, ranges=ranges)

    def keep(self) -> int:
        """Every pack, whole and checked, in the download's layout (by the deadline); the
        bytes downloaded."""
        assert self.download is not None
        return self.download.finish(self.give_up_at)

    @property
    def downloaded_bytes(self) -> int:
        """What the packs' download brought, whatever became of it."""
        return self.download.bytes_written if self.download is not None else 0

    def stop(self) -> None:
        """The packs' download ended, if there is one (the restore failed)."""
        if self.download is not None:
            self.download.cancel()

    def read(self, pages_file: str, offset: int, length: int) -> list[Piece]:
        assert self.source is not None
        return self.source.read(self.files[pages_file], offset, length)

    def ready(self, pages_file: str, offset: int, length: int) -> bool:
        assert self.source is not None
        return self.source.ready(self.files[pages_file], offset, length)

    def start(self, work_dir: str, criu: str, cgroups: list[str]) -> LazyPages:
        """The page source, serving until `wait` ends; the caller closes it after the task.
        The packs' download starts with it."""
        if self.download is not None and self.source is not None:
            _open_files_to_hard_limit()   # checked packs stay open while their chunks go out
            self.source.follow(self.download.start())
        try:
            return LazyPages(self, work_dir, criu, cgroups)
        except BaseException:
            self.stop()
            raise


class LazyPages:
    def __init__(self, memory: LazyMemory, work_dir: str, criu: str, cgroups: list[str]) -> None:
        self.memory, self.work_dir = memory, work_dir
        self.pid = 0
        self.done = False
        self._killed = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = ours
        # an answer (4 MiB at most) goes in at once rather than in ~200 KiB turns with CRIU
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        guard_r, guard_w = os.pipe()
        self._guard_pipe = os.fdopen(guard_w, "w", buffering=1)
        try:
            self.daemon = subprocess.Popen(
                [criu, "lazy-pages", "--page-server", "--ps-socket", str(theirs.fileno()),
                 "-D", memory.criu_dir, "-W", work_dir, "-o", LOG, "-v4"],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            self.guard = subprocess.Popen(
                [sys.executable, "-m", "torpor.lazy.guard", str(guard_r), str(ours.fileno())],
                pass_fds=[guard_r, ours.fileno()], stdin=subprocess.DEVNULL,
                start_new_session=True)
        finally:
            theirs.close()
            os.close(guard_r)
        for path in cgroups:
            self._tell(f"cgroup {path}")
        self.server = PageServer(ours, memory.pagemaps, memory.read, memory.ready)
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="torpor-page-server",
                                        daemon=True)
        self._thread.start()
        self._wait_for_socket()

    def _serve(self) -> None:
        try:
            self.server.serve()
        except BaseException as e:
            self._failure = e

    def _wait_for_socket(self) -> None:
        deadline = time.monotonic() + START_S
        while not os.path.exists(os.path.join(self.work_dir, SOCKET)):
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise RestoreError(f"criu lazy-pages did not start: {self.log_tail()}",
                                   hint=f"its log: {os.path.join(self.work_dir, LOG)}")
            time.sleep(0.005)

    def log_tail(self, lines: int = 3) -> str:
        try:
            with open(os.path.join(self.work_dir, LOG), errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
        except OSError:
            return "no log"
        return " | ".join(t.strip() for t in tail)

    def _tell(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._guard_pipe.write(line + "\n")

    def running(self, pid: int) -> None:
        """The restored init: the guard's to kill if torpor dies before the last page."""
        self.pid = pid
        self._tell(f"pid {pid}")

    def wait(self, report: Callable[[str], None] = lambda _: None, every_s: float = 5.0,
             track: Callable[[int, int, int], None] = lambda placed, remote, local: None,
             ) -> LazyResult:
        """Until every lazy page is placed; else the container killed and RestoreError.
        `report` is told in words every `every_s`; `track` about once a second: the bytes
        placed, fetched from the registry, read from this node."""
        started = last = time.monotonic()
        assert self.memory.source is not None
        counts = self.memory.source.counts
        while self._thread.is_alive():
            self._thread.join(TRACK_S)
            placed = self.server.served.pages * pagemap.PAGE
            track(placed, counts.remote_bytes + counts.streamed_bytes, counts.local_bytes)
            if self._thread.is_alive() and time.monotonic() - last >= every_s:
                last = time.monotonic()
                report(f"{placed >> 20} of {self.memory.lazy_bytes >> 20} MiB of memory placed "
                       f"({last - started:.0f}s)")
        if self._failure is not None:
            self.kill()
            reason = self._failure
            what = "did not arrive before the deadline" if isinstance(
                reason, DeadlineExceeded) else "could not be placed"
            raise RestoreError(
                f"the restored workload's memory {what}: {reason}; it was killed, since a "
                "lazily restored process cannot run on with pages missing",
                hint=f"criu lazy-pages' log: {os.path.join(self.work_dir, LOG)}"
                     if not isinstance(reason, TorporError) else None) from None
        self.done = True
        self._tell("done")
        assert self.memory.source is not None
        served = self.server.served
        counts = self.memory.source.counts
        return LazyResult(self.memory.lazy_bytes, served.done_s,
                          counts.remote_bytes, counts.local_bytes, counts.streamed_bytes)

    def kill(self) -> None:
        """The restored container's processes, frozen and killed (before the socket closes)."""
        if self.pid and not self._killed:
            self._killed = True
            with contextlib.suppress(Exception):
                kill_cgroup(Cgroup.of_pid(self.pid))

    def close(self) -> None:
        if not self.done:
            self.kill()
            self.memory.stop()
        self._tell("done")   # what had to be killed is; the guard may go
        with contextlib.suppress(OSError):
            self._guard_pipe.close()
        self._sock.close()
        self._thread.join(5.0)
        for process in (self.daemon, self.guard):
            try:
                process.wait(10.0)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
                process.wait()
        if self.memory.source is not None:
            self.memory.source.close()


def _open_files_to_hard_limit() -> None:
    """The soft limit on open files raised to the hard one, as every Go program does at start
    (containerd, runc): the default 1024 is a few hundred packs and sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
