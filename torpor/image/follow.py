"""Cutting CRIU's page images while CRIU writes them, so that a checkpoint image has less left
to do once the dump is over.

A checkpoint image cuts every pages-*.img into chunks, hashes each (sha256) and tries each in
zstd (packs.py): for 2 GiB, ~0.7 s of cutting on one thread and ~1 s of sha256, all of it
after CRIU is done, while a core sat idle during the dump. CRIU writes a pages image front to
back and never goes back (criu/page-xfer.c: each batch of pages spliced from the parasite's
pipe to the end of the file), so the bytes below a pages image's size are final. A
`DumpFollower` reads each pages image behind CRIU as it grows (pread: a file cut short under
it is a short read, not a SIGBUS), cuts what it has read exactly as `chunker.cut` cuts the
whole file (chunker.resumed), and hashes and encodes each chunk on a worker. Its threads run
at nice.NICE, each: CRIU, which holds the workload frozen, keeps the CPU it needs.

`write_generation` then takes the chunks it finds here (`FollowedFile.chunk`: by offset and
length) and cuts, hashes and encodes only what the follower had not reached. Nothing here
decides what a checkpoint holds: a generation written with a follower is byte for byte the one
written without (tests/unit/test_follow.py), and a follower that is late, stopped or failed
leaves less done, never something else. A file it cannot vouch for is cut again whole: one
that shrank while followed (CRIU never does that), one that is not, when the generation opens
it, the inode of the same size and mtime as when the follower stopped (after the dump), or one
cut with other chunker parameters (a previous generation's). It stays GUARD bytes behind the
end CRIU is writing, so as not to lean on how the kernel orders a growing file's size and data.

What it keeps: each chunk's digest, and its zstd frame when zstd shrinks it, up to
FRAME_BUDGET bytes of frames; beyond that a frame is made again when the pack is written. A
chunk stored raw (random memory) costs nothing to remember.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
import time
from collections import deque
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from torpor.image.chunker import DEFAULT_PARAMS, PAGE, ChunkerParams, MappedFile, Span, cut, resumed
from torpor.image.packfile import LEVEL, FrameEncoder
from torpor.nice import lower_priority

WINDOW = 16 << 20         # bytes read and cut at once (at least two of the largest chunks)
GUARD = 1 << 20           # bytes right behind the end CRIU is writing: left for the next look
FRAME_BUDGET = 256 << 20  # zstd frames kept for the pack writer; past it, only digests
POLL_S = 0.01
MAX_OPEN = 16             # pages images followed at once (a container may dump thousands)
IDLE_S = 0.25             # one that has not grown for this long is done: closed, not read again
BUSY_IDLE_S = 0.05        # ... or this long while other pages images wait for a descriptor
IN_FLIGHT = 64            # chunks waiting for a worker, at most
PAGES_IMAGE = re.compile(r"pages-[0-9]+\.img")


@dataclass
class FollowedFile:
    """What the follower made of one pages image: its spans over [0, end) and, by offset, each
    chunk's (length, sha256, frame: bytes, RAW, or None for one to encode again); `final`, the
    file's (size, mtime) when the follower stopped, once the dump was over."""

    ino: int
    dev: int
    spans: list[Span] = field(default_factory=list)
    end: int = 0
    chunks: dict[int, tuple[int, bytes, bytes | None]] = field(default_factory=dict)
    final: tuple[int, int] | None = None
    broken: bool = False      # it shrank while followed: nothing of it is used

    def spans_of(self, mapped: MappedFile,
                 params: ChunkerParams) -> Generator[Span, None, None] | None:
        """The whole file's spans, the followed ones first; None unless `mapped` is the file
        this followed, as it was when the follower stopped (inode, size and mtime)."""
        st = os.fstat(mapped.fd)
        if self.broken or self.final is None or self.end > mapped.size or \
                (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns) != (self.ino, self.dev,
                                                                      *self.final):
            return None
        return resumed(mapped, self.spans, self.end, params)

    def chunk(self, span: Span) -> tuple[str, bytes | None] | None:
        """(digest, frame) of a chunk the follower hashed, or None."""
        found = self.chunks.get(span.offset)
        if found is None or found[0] != span.length:
            return None
        return "sha256:" + found[1].hex(), found[2]


@dataclass(frozen=True)
class Followed:
    """What a follower made, for `write_generation`: the files by name, and the chunker
    parameters and zstd level it cut and encoded with."""

    params: ChunkerParams
    level: int
    files: dict[str, FollowedFile]

    def under(self, prefix: str) -> Followed:
        """The same, the files named as under `prefix` (as the generation names them)."""
        return Followed(self.params, self.level,
                        {f"{prefix}{name}": f for name, f in self.files.items()})

    def bytes_followed(self) -> int:
        return sum(f.end for f in self.files.values())


class DumpFollower:
    """Follows the pages images appearing under `directory` from `start()` until `stop()`,
    which is to come once the dump is over. The follower's thread owns its descriptors: at
    most MAX_OPEN, each closed once its file stops growing, all closed when it ends."""

    def __init__(self, directory: str, params: ChunkerParams = DEFAULT_PARAMS,
                 level: int = LEVEL, frame_budget: int = FRAME_BUDGET) -> None:
        self.directory, self.params, self.level = directory, params, level
        self.frame_budget = frame_budget
        self.window = max(WINDOW, 2 * (params.max_size + PAGE))
        self.files: dict[str, FollowedFile] = {}
        self.error: BaseException | None = None
        self.followed: Followed | None = None   # once stopped as a context manager
        self._open: dict[str, tuple[int, float, int]] = {}   # name -> fd, grew last at, size
        self._waiting = False   # pages images not opened yet, for want of a descriptor
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: deque[Future[None]] = deque()
        self._kept = 0
        self._lock = threading.Lock()
        self._encoder = FrameEncoder(level)

    def __enter__(self) -> DumpFollower:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.followed = self.stop()

    @property
    def followed_bytes(self) -> int:
        """Bytes cut so far (read while it runs: a figure, not a promise)."""
        return sum(f.end for f in list(self.files.values()))

    def start(self) -> DumpFollower:
        workers = max(1, (os.cpu_count() or 1) - 1)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="torpor-follow",
                                        initializer=lower_priority)
        self._thread = threading.Thread(target=self._run, name="torpor-follow", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Followed:
        """Stop following; what it made (nothing if it failed), the files named relative to
        `directory`, each with its size and mtime now, which the generation checks."""
        self._stop.set()
        try:
            if self._thread is not None:
                self._thread.join()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
        if self.error is not None:
            self.files.clear()
        for name, followed in self.files.items():
            try:
                st = os.stat(os.path.join(self.directory, name), follow_symlinks=False)
            except OSError:
                continue
            if (st.st_ino, st.st_dev) == (followed.ino, followed.dev):
                followed.final = (st.st_size, st.st_mtime_ns)
        return Followed(self.params, self.level, dict(self.files))

    def _run(self) -> None:
        lower_priority()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                self._open_new(now)
                moved = False
                for name in list(self._open):
                    while not self._stop.is_set() and self._advance(name, now):
                        moved = True
                self._close_idle(now)
                if not moved:
                    self._stop.wait(POLL_S)
        except BaseException as e:   # the generation cuts everything itself then
            self.error = e
        finally:
            for fd, _, _ in self._open.values():
                os.close(fd)
            self._open.clear()

    def _open_new(self, now: float) -> None:
        """Open the pages images not seen before, up to MAX_OPEN at once (the directory is
        listed each POLL_S while fewer are open: a dump writes a small process's pages in a
        few milliseconds)."""
        try:
            names = sorted(e.name for e in os.scandir(self.directory)
                           if PAGES_IMAGE.fullmatch(e.name) and e.name not in self.files)
        except OSError:
            return
        self._waiting = len(names) > MAX_OPEN - len(self._open)
        for name in names[:max(0, MAX_OPEN - len(self._open))]:
            try:
                fd = os.open(os.path.join(self.directory, name),
                             os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue   # a symlink, or gone: seen again at the next scan
            st = os.fstat(fd)
            self.files[name] = FollowedFile(st.st_ino, st.st_dev)
            if not stat.S_ISREG(st.st_mode):
                self.files[name].broken = True
                os.close(fd)
                continue
            self._open[name] = (fd, now, st.st_size)

    def _close_idle(self, now: float) -> None:
        idle = BUSY_IDLE_S if self._waiting else IDLE_S
        for name, (fd, grew, _) in list(self._open.items()):
            if now - grew > idle:
                os.close(fd)
                del self._open[name]

    def _advance(self, name: str, now: float) -> bool:
        """Cut and hand out the next window of `name`; whether there was one."""
        fd, _, last = self._open[name]
        followed = self.files[name]
        size = os.fstat(fd).st_size
        if size < max(last, followed.end):   # CRIU never does this: trust none of it
            followed.broken = True
            os.close(fd)
            del self._open[name]
            return False
        if size != last:
            self._open[name] = (fd, now, size)
        ready = size - size % PAGE - GUARD - followed.end
        if ready < min(self.window, self.params.max_size + PAGE):
            return False   # a chunk may still grow past it: wait for more
        data = os.pread(fd, min(ready, self.window), followed.end)
        data = data[:len(data) - len(data) % PAGE]
        spans = list(cut(data, self.params, base=followed.end))
        # the last chunk may go on past the window; a zero run may be split (merged later)
        final = spans if spans and spans[-1].zero else spans[:-1]
        if not final:
            return False
        for span in final:
            if not span.zero:
                self._submit(followed, data, span, followed.end)
        followed.spans.extend(final)
        followed.end = final[-1].offset + final[-1].length
        return True

    def _submit(self, followed: FollowedFile, data: bytes, span: Span, base: int) -> None:
        assert self._pool is not None
        while len(self._jobs) >= IN_FLIGHT:
            self._jobs.popleft().result()
        self._jobs.append(self._pool.submit(self._chunk, followed, data, span, base))

    def _chunk(self, followed: FollowedFile, data: bytes, span: Span, base: int) -> None:
        view = memoryview(data)[span.offset - base:span.offset - base + span.length]
        try:
            digest = hashlib.sha256(view).digest()
            frame: bytes | None = None
            if self._kept < self.frame_budget:
                frame = self._encoder.frame(view)
                with self._lock:
                    self._kept += len(frame)
            followed.chunks[span.offset] = (span.length, digest, frame)
        finally:
            view.release()
