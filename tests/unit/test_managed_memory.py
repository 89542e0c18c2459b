"""torpor's look at a process's mappings of /dev/nvidia-uvm: the CUDA runtime's 2 MiB window
(every CUDA process has one: an H200 on driver 580.159.04) is no managed memory; managed
allocations add mappings of their own size, or a second 2 MiB window on a one-GPU process."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from torpor.gpu.session import managed_memory

WINDOW = 2 << 20


def test_the_runtimes_window_is_no_managed_memory_but_more_is(tmp_path: Path) -> None:
    uvm = tmp_path / "nvidia-uvm"
    uvm.write_bytes(bytes(WINDOW * 2 + (6 << 20)))
    fd = os.open(uvm, os.O_RDWR)
    maps = [mmap.mmap(fd, WINDOW)]
    try:
        assert managed_memory(os.getpid(), gpus=1) == 0
        maps.append(mmap.mmap(fd, WINDOW, offset=WINDOW))       # a second window
        assert managed_memory(os.getpid(), gpus=1) == WINDOW     # one GPU: one is managed
        assert managed_memory(os.getpid(), gpus=2) == 0          # two GPUs: maybe one each
        assert managed_memory(os.getpid()) == 0                  # GPUs unknown: not counted
        maps.append(mmap.mmap(fd, 6 << 20, offset=2 * WINDOW))  # an allocation of its own size
        assert managed_memory(os.getpid(), gpus=2) == 6 << 20
    finally:
        for m in maps:
            m.close()
        os.close(fd)
