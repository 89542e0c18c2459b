"""A disk that loses what was not synced: ext4 in a file, mounted through a loop device, and a
"power loss" that keeps only what reached that device.

The loop device writes to its backing file; ext4 above it keeps unsynced data in its own page
cache (delayed allocation: no blocks, no data on the device, until writeback, which the kernel
starts after 30 s, or an fsync). `crash()` copies the backing file as the device holds it at
that instant, and mounts the copy (ext4 replays its journal, as after a power cut): files that
were fsynced are there, with their data; files that were not are missing or empty. The running
filesystem is left as it was. Device-mapper (dm-flakey) is not needed, which this kernel lacks.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class CrashDisk:
    root: Path
    mount: Path
    crashed: list[Path] = field(default_factory=list)

    def crash(self) -> Path:
        """The filesystem as a power loss now would leave it, mounted (rw: the journal replays)."""
        n = len(self.crashed)
        image = self.root / f"crash-{n}.img"
        subprocess.run(["cp", "--sparse=always", str(self.root / "disk.img"), str(image)],
                       check=True)
        mount = self.root / f"after-crash-{n}"
        mount.mkdir()
        subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
        self.crashed.append(mount)
        return mount


@contextlib.contextmanager
def crash_disk(root: Path, size: str = "384M") -> Iterator[CrashDisk]:
    root.mkdir(parents=True, exist_ok=True)
    image = root / "disk.img"
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    # commit=60: the journal's own periodic commit does not push metadata out meanwhile
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    mount = root / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-o", "loop,commit=60", str(image), str(mount)], check=True)
    disk = CrashDisk(root, mount)
    try:
        yield disk
    finally:
        for path in [*disk.crashed, mount]:
            unmount(path)
        for leftover in root.glob("*.img"):
            leftover.unlink(missing_ok=True)


def unmount(path: Path) -> None:
    """Unmount, waiting a little for what a checkpoint left running there to let go; lazily
    in the end, so that no mount outlives the test."""
    for _ in range(50):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    subprocess.run(["umount", "-l", str(path)], check=False)
