"""A live process's memory as CRIU would dump it, read without stopping the process.

CRIU writes, per process, the pages of its private mappings that are present or swapped out,
in address order, except pages of a private file mapping still shared with the file (never
written) and pages mapped to the kernel's zero page (`should_dump_page`, criu/mem.c): that is
what pages-<id>.img holds. `dump_pages(pid)` yields the same pages, read through
/proc/PID/pagemap (present, swapped, file-backed bits; PFNs need root) and /proc/PID/mem, and
tells zero-page mappings from written zeros by /proc/kpageflags. The process keeps running:
pages written meanwhile are read as they are then, which is all an estimate needs.

Stdlib only.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from torpor.errors import CheckpointError

PAGE = 4096
PM_PRESENT = 1 << 63
PM_SWAPPED = 1 << 62
PM_FILE_OR_SHARED = 1 << 61
PFN_MASK = (1 << 55) - 1
KPF_ZERO_PAGE = 1 << 24
_ZERO = bytes(PAGE)
BATCH_PAGES = 256          # pagemap entries and page data read per call (1 MiB)
NOT_DUMPED = ("[vvar]", "[vvar_vclock]", "[vsyscall]")


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str       # "rw-p"
    path: str        # "" for anonymous memory, "[heap]", "/usr/lib/..."

    @property
    def private(self) -> bool:
        return self.perms[3:4] == "p"

    @property
    def file_backed(self) -> bool:
        return self.path.startswith("/")


def mappings(pid: int) -> list[Mapping]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise CheckpointError(f"cannot read the mappings of pid {pid}: {e.strerror}") from None
    out = []
    for line in lines:
        fields = line.split(maxsplit=5)
        start, _, end = fields[0].partition("-")
        out.append(Mapping(int(start, 16), int(end, 16), fields[1],
                           fields[5] if len(fields) > 5 else ""))
    return out


class _ZeroPages:
    """Whether a PFN is the kernel's zero page (cached: it is one page, seen many times)."""

    def __init__(self) -> None:
        self.known: dict[int, bool] = {}
        try:
            self.fd: int | None = os.open("/proc/kpageflags", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.fd = None

    def __call__(self, pfn: int) -> bool:
        if pfn not in self.known:
            flags = 0
            if self.fd is not None and pfn:
                data = os.pread(self.fd, 8, pfn * 8)
                flags = struct.unpack("<Q", data)[0] if len(data) == 8 else 0
            self.known[pfn] = bool(flags & KPF_ZERO_PAGE)
        return self.known[pfn]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def dump_pages(pid: int) -> Iterator[memoryview]:
    """The pages CRIU would write for `pid`, in its order; each view is valid until the next."""
    try:
        pagemap = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise CheckpointError(f"cannot read the memory of pid {pid}: {e.strerror}",
                              hint="torpor estimate runs as root") from None
    zero_page = _ZeroPages()
    try:
        for mapping in mappings(pid):
            if not mapping.private or mapping.path in NOT_DUMPED:
                continue
            yield from _mapping_pages(pagemap, mem, mapping, zero_page)
    finally:
        zero_page.close()
        os.close(pagemap)
        os.close(mem)


def _mapping_pages(pagemap: int, mem: int, mapping: Mapping,
                   zero_page: _ZeroPages) -> Iterator[memoryview]:
    for batch in range(mapping.start, mapping.end, BATCH_PAGES * PAGE):
        count = min(BATCH_PAGES, (mapping.end - batch) // PAGE)
        raw = os.pread(pagemap, count * 8, batch // PAGE * 8)
        entries = struct.unpack(f"<{len(raw) // 8}Q", raw)
        wanted = [i for i, e in enumerate(entries)
                  if e & (PM_PRESENT | PM_SWAPPED)
                  and not (mapping.file_backed and e & PM_FILE_OR_SHARED)]
        if not wanted:
            continue
        first, last = wanted[0], wanted[-1]
        try:
            data = os.pread(mem, (last - first + 1) * PAGE, batch + first * PAGE)
        except OSError:
            continue  # unmapped meanwhile, or an I/O mapping: not memory CRIU dumps
        view = memoryview(data)
        for i in wanted:
            at = (i - first) * PAGE
            if at + PAGE > len(view):
                break
            page = view[at:at + PAGE]
            if entries[i] & PM_PRESENT and page == _ZERO and \
                    zero_page(entries[i] & PFN_MASK):
                continue  # mapped to the zero page: CRIU leaves it out
            yield page
