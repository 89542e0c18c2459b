"""The files a checkpoint saves besides CRIU's images: which ones (the policy) and what was
saved (the read-write layer, bind-mounted volumes, a bind-mounted /dev/shm)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torpor.errors import FormatError
from torpor.formats.fields import Fields
from torpor.formats.flat import from_flat, to_flat

# "all" (every read-write volume), "none", or the destinations to save
VolumePolicy = str | tuple[str, ...]


def parse_volume_policy(value: str | list[str] | tuple[str, ...] | None) -> VolumePolicy | None:
    """"all", "none", "/a,/b" or a list of destinations; None stays None (not set)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(v.rstrip("/") or "/" for v in value)
    value = value.strip()
    if value in ("all", "none"):
        return value
    return tuple(v.strip().rstrip("/") or "/" for v in value.split(",") if v.strip())


@dataclass(frozen=True)
class FilePolicy:
    volumes: VolumePolicy = "all"
    dev_shm: bool = True
    rootfs: bool = True

    def to_json(self) -> dict[str, Any]:
        volumes = self.volumes if isinstance(self.volumes, str) else list(self.volumes)
        return {"volumes": volumes, "dev_shm": self.dev_shm, "rootfs": self.rootfs}

    @classmethod
    def from_json(cls, f: Fields) -> FilePolicy:
        raw = f.data.get("volumes", "all")
        if not isinstance(raw, (str, list)):
            raise FormatError(f"{f.what}: volumes must be \"all\", \"none\" or a list")
        volumes = parse_volume_policy(raw if isinstance(raw, str) else f.strings("volumes"))
        return cls(volumes=volumes or "all", dev_shm=f.boolean("dev_shm", True),
                   rootfs=f.boolean("rootfs", True))


@dataclass(frozen=True)
class SavedVolume:
    """A bind-mounted volume (or /dev/shm) saved as a flat tar file in the image directory."""

    index: int               # -1 for /dev/shm
    destination: str
    source: str
    kind: str                # "dir" or "file"
    read_only: bool
    archive: str             # a file name in <image-path> (names.volume_archive)
    bytes: int = 0


@dataclass(frozen=True)
class SavedRootfs:
    archive: str
    entries: int
    bytes: int


@dataclass(frozen=True)
class SavedFiles:
    rootfs: SavedRootfs | None = None
    volumes: tuple[SavedVolume, ...] = ()
    dev_shm: SavedVolume | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rootfs": to_flat(self.rootfs) if self.rootfs else None,
                "volumes": [to_flat(v) for v in self.volumes],
                "dev_shm": to_flat(self.dev_shm) if self.dev_shm else None}

    @classmethod
    def from_json(cls, f: Fields) -> SavedFiles:
        rootfs, shm = f.optional_child("rootfs"), f.optional_child("dev_shm")
        return cls(rootfs=from_flat(SavedRootfs, rootfs) if rootfs else None,
                   volumes=tuple(from_flat(SavedVolume, v) for v in f.children("volumes")),
                   dev_shm=from_flat(SavedVolume, shm) if shm else None)


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint directory, relative to it, with its size."""

    path: str
    size: int


@dataclass(frozen=True)
class Sizes:
    memory_pages: int = 0
    total: int = 0
    rootfs_diff: int = 0


def file_entries(f: Fields, key: str) -> tuple[FileEntry, ...]:
    return tuple(from_flat(FileEntry, x) for x in f.children(key))

