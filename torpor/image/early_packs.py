"""Packing the biggest pages images while CRIU still writes them, so that their packs can go
up to a registry before the dump is over instead of after it.

A DumpFollower (follow.py) cuts and hashes each pages image behind CRIU. Beside it, an
`EarlyPacker` takes each pages image that has grown past `PackSizing.settled` (2 GiB: from
there on a file's pack sizes no longer change) and places the follower's chunks into packs
from the file's start, in order, as write_generation places them (packs.EarlyFile). Each pack,
once whole, goes to `on_pack` (a checkpoint to a registry sends it, niced, while CRIU dumps).
A chunk the follower kept a frame of is not encoded again; a raw one (random memory) is read
back with pread below the follower's end, where the file is final.

Its thread runs at nice.NICE below its caller, as the follower's do: CRIU, which holds the
workload frozen, keeps the CPU it needs. What it makes is only a head start: write_generation
takes a file's early packs as far as they are what it would have written
(packs._Generation.begin_file_from: up to the first chunk an earlier file holds) and packs the
rest itself, so a generation is the same with or without them; packs sent for nothing are
blobs no manifest refers to.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torpor.formats.chunk_index import PackRecord
from torpor.image.follow import POLL_S, DumpFollower, FollowedFile
from torpor.image.packfile import RAW
from torpor.image.packs import DEFAULT_SIZING, ChunkLocation, EarlyFile, PackSizing
from torpor.nice import lower_priority

# a pages image the follower has not moved on in is looked at (stat) again after this long:
# CRIU may write on past 2 GiB while the follower, niced, waits for the CPU
LOOK_AGAIN_S = 0.1


@dataclass(frozen=True)
class EarlyPacks:
    """What an EarlyPacker made: the pack directory its packs are in, and its files by name
    (relative to the follower's directory)."""

    pack_dir: str
    files: dict[str, EarlyFile]

    def under(self, prefix: str) -> dict[str, EarlyFile]:
        """The files named as under `prefix` (as the generation names them)."""
        return {f"{prefix}{name}": f for name, f in self.files.items()}

    def abandon(self) -> None:
        """The open packs' temporary files removed (those a generation took are its own)."""
        for early in self.files.values():
            early.abandon()


class EarlyPacker:
    """Packs, beside `follower`, each pages image that passes `sizing.settled`, into
    `pack_dir`, from `start()` until `stop()` (once the dump is over, the follower's `stop()`
    after). `known`: the chunks the generation will not store (its previous one's), the very
    mapping it is given, or what is packed here is not taken."""

    def __init__(self, follower: DumpFollower, pack_dir: str, known: Mapping[str, ChunkLocation],
                 level: int, sizing: PackSizing = DEFAULT_SIZING,
                 on_pack: Callable[[PackRecord], None] | None = None) -> None:
        self.follower, self.pack_dir, self.known = follower, pack_dir, known
        self.level, self.sizing, self.on_pack = level, sizing, on_pack
        self.files: dict[str, EarlyFile] = {}
        self.error: BaseException | None = None
        self.packed: EarlyPacks | None = None   # once stopped as a context manager
        self._fds: dict[str, int] = {}
        self._next: dict[str, int] = {}   # name -> the next of its followed spans to place
        self._looked: dict[str, tuple[int, float]] = {}   # name -> the follower's end, when
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> EarlyPacker:
        return self.start()

    def __exit__(self, kind: object, *exc: object) -> None:
        self.packed = self.stop()
        if kind is not None:   # the dump failed: nothing of it is built
            self.packed.abandon()

    @property
    def packed_bytes(self) -> int:
        """Bytes of whole packs so far (read while it runs: a figure, not a promise)."""
        return sum(f.packed_bytes for f in list(self.files.values()))

    def abandon(self) -> None:
        """Every open pack's temporary file removed, once stopped (a generation that took a
        file's packs took its open one too)."""
        for early in list(self.files.values()):
            early.abandon()

    def start(self) -> EarlyPacker:
        os.makedirs(self.pack_dir, mode=0o700, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="torpor-early-packs", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> EarlyPacks:
        """Stop packing (after the chunk at hand); what it made, nothing if it failed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        packed = EarlyPacks(self.pack_dir, dict(self.files))
        if self.error is not None:
            packed.abandon()
            return EarlyPacks(self.pack_dir, {})
        return packed

    def _run(self) -> None:
        lower_priority()
        try:
            while not self._stop.is_set():
                moved = False
                for name, followed in list(self.follower.files.items()):
                    if self._stop.is_set():
                        break
                    if name in self.files or self._begin(name, followed):
                        moved = self._pack(name, followed) or moved
                if not moved:
                    self._stop.wait(POLL_S)
        except BaseException as e:   # the generation packs everything itself then
            self.error = e
        finally:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def _begin(self, name: str, followed: FollowedFile) -> bool:
        """Whether `name` is big enough now to be packed from its start (opened then)."""
        if followed.broken or not followed.spans:
            return False
        now = time.monotonic()
        end, at = self._looked.get(name, (-1, 0.0))
        if end == followed.end and now - at < LOOK_AGAIN_S:
            return False   # looked at since the follower moved on in it, and lately
        self._looked[name] = (followed.end, now)
        path = os.path.join(self.follower.directory, name)
        try:
            if os.stat(path, follow_symlinks=False).st_size < self.sizing.settled:
                return False
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return False
        st = os.fstat(fd)
        if (st.st_ino, st.st_dev) != (followed.ino, followed.dev):
            os.close(fd)
            return False
        self._fds[name] = fd
        self._next[name] = 0
        self.files[name] = EarlyFile(self.pack_dir, self.known, self.sizing, self.level,
                                     self.on_pack)
        return True

    def _pack(self, name: str, followed: FollowedFile) -> bool:
        """Place the spans of `name` the follower has hashed, in order; whether any was."""
        early, fd, i = self.files[name], self._fds[name], self._next[name]
        frames = self.follower.level == self.level
        start = i
        while i < len(followed.spans) and not self._stop.is_set() and not followed.broken:
            span = followed.spans[i]
            digest, frame, data = "", None, memoryview(b"")
            if not span.zero:
                found = followed.chunks.get(span.offset)
                if found is None or found[0] != span.length:
                    break   # not hashed yet
                digest, frame = "sha256:" + found[1].hex(), found[2] if frames else None
                if frame is None or frame == RAW:
                    read = os.pread(fd, span.length, span.offset)
                    if len(read) != span.length:
                        raise OSError(f"{name}: {len(read)} bytes at {span.offset}, "
                                      f"{span.length} followed")
                    data = memoryview(read)
            early.place(span, digest, frame, data)
            i += 1
        self._next[name] = i
        return i != start
