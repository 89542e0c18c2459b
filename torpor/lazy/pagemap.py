"""Which pages of a dump are lazy, and where each lies in CRIU's page files.

A process's pagemap-PID.img is a head (the number N of its pages-N.img) and runs of pages:
a start address, a count and flags. A run that is PE_PRESENT has its pages in pages-N.img,
the runs in order, back to back; PE_LAZY marks the ones `criu lazy-pages` may place after
the restore (private anonymous memory, not the stack). The rest (shared memory, the stack,
locked pages) CRIU's restore reads from pages-N.img itself: those bytes must be in place
before it starts. A run in a parent image (a pre-dump's, PE_PARENT) is refused: a lazy
restore serves only what its own generation holds.
"""

from __future__ import annotations

import bisect
import itertools
import os
import re
from dataclasses import dataclass

from torpor.criu_images.reader import read_headed
from torpor.errors import FormatError

PAGE = 4096
PE_PARENT, PE_LAZY, PE_PRESENT = 1, 2, 4
_PAGEMAP = re.compile(r"pagemap-(\d+)\.img\Z")


@dataclass(frozen=True)
class Run:
    vaddr: int
    pages: int
    lazy: bool
    offset: int   # of its first page in the pages file


@dataclass(frozen=True)
class Pagemap:
    pid: int
    pages_file: str            # the name of its pages-N.img in the image directory
    runs: tuple[Run, ...]      # present runs, by address

    def find(self, vaddr: int) -> Run | None:
        """The run holding the page at `vaddr`."""
        at = bisect.bisect_right(self._starts, vaddr) - 1
        if at >= 0:
            run = self.runs[at]
            if vaddr < run.vaddr + run.pages * PAGE:
                return run
        return None

    @property
    def _starts(self) -> list[int]:
        starts = self.__dict__.get("_starts_cache")
        if starts is None:
            starts = [r.vaddr for r in self.runs]
            object.__setattr__(self, "_starts_cache", starts)
        return starts

    def eager(self) -> list[tuple[int, int]]:
        """(offset, length) in the pages file of every run CRIU's restore reads itself."""
        return [(r.offset, r.pages * PAGE) for r in sorted(self.runs, key=lambda r: r.offset)
                if not r.lazy]

    @property
    def lazy_bytes(self) -> int:
        return sum(r.pages * PAGE for r in self.runs if r.lazy)


def read(image_dir: str) -> dict[int, Pagemap]:
    """Every process's pagemap in a CRIU image directory, by the pid CRIU dumped it as."""
    found = {}
    for name in sorted(os.listdir(image_dir)):
        match = _PAGEMAP.match(name)
        if match:
            pid = int(match.group(1))
            found[pid] = _one(os.path.join(image_dir, name), pid)
    return found


def _one(path: str, pid: int) -> Pagemap:
    head, entries = read_headed(path, "PAGEMAP", "pagemap_head", "pagemap_entry")
    runs, offset = [], 0
    for entry in entries:
        flags = entry.flags if entry.HasField("flags") else PE_PRESENT
        if entry.in_parent or flags & PE_PARENT:
            raise FormatError(f"{os.path.basename(path)} has pages in a parent image (a "
                              "pre-dump's): a lazy restore serves only its own generation's")
        if not flags & PE_PRESENT:
            continue
        if entry.vaddr % PAGE or not entry.nr_pages:
            raise FormatError(f"{os.path.basename(path)} has a run at {entry.vaddr:#x} of "
                              f"{entry.nr_pages} pages")
        runs.append(Run(entry.vaddr, entry.nr_pages, bool(flags & PE_LAZY), offset))
        offset += entry.nr_pages * PAGE
    runs.sort(key=lambda r: r.vaddr)
    for a, b in itertools.pairwise(runs):
        if a.vaddr + a.pages * PAGE > b.vaddr:
            raise FormatError(f"{os.path.basename(path)} has overlapping runs at {b.vaddr:#x}")
    return Pagemap(pid, f"pages-{head.pages_id}.img", tuple(runs))
