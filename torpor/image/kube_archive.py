"""kubelet's checkpoint archive (the CRI `CheckpointContainer` of containerd 2.x and CRI-O), read
and written. docs/kubernetes.md describes it for users:

    checkpoint/          CRIU's images, flat; torpor-runc's torpor-* files among them
    config.dump          formats.kube.KubeContainerConfig
    spec.dump            the OCI runtime spec
    status.dump          formats.kube.KubeContainerStatus (containerd 2.1+ restores need it)
    rootfs-diff.tar      the read-write layer as an OCI layer: gzip from containerd, zstd from
                         torpor (containerd 2.x restores read gzip, zstd or plain)
    dump.log             CRIU's log of the dump
    container.log, stats-dump, status      containerd's extras, kept as they are

An uncompressed tar of a `checkpoint/` directory entry and regular files: containerd 2.1.9+
skips anything else on restore, and checkpointctl looks for that directory entry. Reading only
walks the headers and the small files; nothing is extracted but into a directory the caller
names, through torpor.archive's strict mode.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tarfile
from dataclasses import dataclass

from torpor import archive
from torpor.errors import ImageError, UnsafeArchive
from torpor.formats import kube, names
from torpor.formats.files import FileEntry
from torpor.formats.oci import OciSpec
from torpor.formats.state import ContainerState

SMALL_FILE_LIMIT = 16 << 20
GZIP_MAGIC, ZSTD_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
PAGES_PREFIX = f"{names.KUBE_CHECKPOINT_DIR}/pages-"


@dataclass(frozen=True)
class KubeArchive:
    """What a kubelet checkpoint archive holds, read from its headers and small files."""

    path: str
    config: kube.KubeContainerConfig
    spec: OciSpec
    status: kube.KubeContainerStatus | None     # containerd 2.0 and CRI-O write none
    state: ContainerState | None                # torpor-runc's, when a torpor pod was taken
    entries: tuple[FileEntry, ...]              # every regular file, with its size

    @property
    def checkpoint_bytes(self) -> int:
        """CRIU's images and torpor's files (what checkpointctl calls the checkpoint size)."""
        prefix = f"{names.KUBE_CHECKPOINT_DIR}/"
        return sum(e.size for e in self.entries if e.path.startswith(prefix))

    @property
    def memory_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.path.startswith(PAGES_PREFIX))

    @property
    def rootfs_diff_bytes(self) -> int:
        return next((e.size for e in self.entries if e.path == names.KUBE_ROOTFS_DIFF), 0)

    @property
    def container_name(self) -> str:
        """The container's name in its pod."""
        from torpor.formats import annotations as ann

        return (self.status.name if self.status and self.status.name else
                str((self.spec.get("annotations") or {}).get(ann.CRI_CONTAINER_NAME) or
                    self.config.name))


def is_archive(path: str) -> bool:
    """A tar file with the engine's records of a kubelet checkpoint."""
    if not os.path.isfile(path):
        return False
    try:
        with tarfile.open(path, "r:") as tar:
            found = {_name(m) for m in tar}
    except (tarfile.TarError, OSError):
        return False
    return {names.KUBE_CONFIG_DUMP, names.KUBE_SPEC_DUMP} <= found


def read(path: str) -> KubeArchive:
    """The archive's records, every entry checked (plain names, files and directories only)."""
    small: dict[str, bytes] = {}
    wanted = {names.KUBE_CONFIG_DUMP, names.KUBE_SPEC_DUMP, names.KUBE_STATUS_DUMP,
              f"{names.KUBE_CHECKPOINT_DIR}/{names.CONTAINER_STATE}"}
    entries = []
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                name = _name(member)
                if not (member.isfile() or member.isdir()):
                    raise UnsafeArchive(f"{path}: entry {member.name!r} is neither a file nor "
                                        "a directory")
                if not member.isfile():
                    continue
                entries.append(FileEntry(name, member.size))
                if name in wanted:
                    if member.size > SMALL_FILE_LIMIT:
                        raise ImageError(f"{path}: {name} is {member.size} bytes: not a record")
                    source = tar.extractfile(member)
                    small[name] = source.read() if source else b""
    except tarfile.TarError as e:
        raise ImageError(f"{path} is not a tar archive: {e}") from None
    for required in (names.KUBE_CONFIG_DUMP, names.KUBE_SPEC_DUMP):
        if required not in small:
            raise ImageError(f"{path} is not a kubelet checkpoint archive: it has no {required}")
    config = kube.KubeContainerConfig.from_json(
        kube.loads(small[names.KUBE_CONFIG_DUMP], f"{path}: {names.KUBE_CONFIG_DUMP}"))
    spec = kube.loads(small[names.KUBE_SPEC_DUMP], f"{path}: {names.KUBE_SPEC_DUMP}").data
    status = None
    if names.KUBE_STATUS_DUMP in small:
        status = kube.KubeContainerStatus.from_json(
            kube.loads(small[names.KUBE_STATUS_DUMP], f"{path}: {names.KUBE_STATUS_DUMP}"))
    state_name = f"{names.KUBE_CHECKPOINT_DIR}/{names.CONTAINER_STATE}"
    state = ContainerState.loads(small[state_name], f"{path}: {state_name}") \
        if state_name in small else None
    return KubeArchive(path, config, spec, status, state, tuple(entries))


def extract(path: str, target: str) -> None:
    """Every file of the archive below `target` (a new directory), nothing outside it."""
    os.makedirs(target, mode=0o700)
    archive.extract(path, target, mode="strict")


def decompress_layer(source: str, target: str) -> None:
    """rootfs-diff.tar (gzip, zstd or plain) as a plain tar at `target`."""
    with open(source, "rb") as f:
        magic = f.read(4)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
        if magic.startswith(GZIP_MAGIC):
            import gzip

            with gzip.open(src) as plain:
                shutil.copyfileobj(plain, out, 1 << 20)
        elif magic == ZSTD_MAGIC:
            import zstandard

            zstandard.ZstdDecompressor().copy_stream(src, out, read_size=1 << 20,
                                                     write_size=1 << 20)
        else:
            shutil.copyfileobj(src, out, 1 << 20)


def compress_layer(source: str, target: str, level: int = 3) -> None:
    """A plain tar (torpor's rootfs-diff.tar) as zstd, for an archive's rootfs-diff.tar."""
    import zstandard

    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
        zstandard.ZstdCompressor(level=level).copy_stream(src, out, read_size=1 << 20,
                                                          write_size=1 << 20)


@dataclass(frozen=True)
class ArchiveParts:
    """What goes into an archive: files on disk under their names in it."""

    criu_files: tuple[tuple[str, str], ...]        # (name in checkpoint/, path)
    config: kube.KubeContainerConfig
    spec: OciSpec
    status: kube.KubeContainerStatus
    rootfs_diff: str | None = None                 # a layer file (plain, gzip or zstd)
    extras: tuple[tuple[str, str], ...] = ()       # (top-level name, path): dump.log...


def write(out_path: str, parts: ArchiveParts, mtime: int = 0) -> int:
    """The archive at `out_path` (0600, replaced whole); returns its size."""
    partial = f"{out_path}.partial"
    with contextlib.suppress(FileNotFoundError):  # left by a crash: a new file, never that one
        os.unlink(partial)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w|",
                                                     format=tarfile.PAX_FORMAT) as tar:
            directory = tarfile.TarInfo(names.KUBE_CHECKPOINT_DIR)
            directory.type, directory.mode, directory.mtime = tarfile.DIRTYPE, 0o700, mtime
            tar.addfile(directory)
            for name, path in sorted(parts.criu_files):
                _add_file(tar, f"{names.KUBE_CHECKPOINT_DIR}/{archive.safe_name(name)}", path,
                          mtime)
            records = {names.KUBE_CONFIG_DUMP: kube.dumps(parts.config.to_json()),
                       names.KUBE_SPEC_DUMP: kube.dumps(parts.spec),
                       names.KUBE_STATUS_DUMP: kube.dumps(parts.status.to_json())}
            files = {**dict(parts.extras),
                     **({names.KUBE_ROOTFS_DIFF: parts.rootfs_diff} if parts.rootfs_diff else {})}
            for name in sorted({*records, *files}):
                if name in records:
                    _add_bytes(tar, name, records[name], mtime)
                else:
                    _add_file(tar, archive.safe_name(name), files[name], mtime)
        os.replace(partial, out_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    return os.path.getsize(out_path)


def criu_files(criu_dir: str, hide_descriptors: bool) -> list[tuple[str, str]]:
    """(name, path) of every file of a CRIU image directory, which must be flat; with
    `hide_descriptors`, runc's descriptors.json goes under torpor's name (capture/pod.py)."""
    found = []
    for name in sorted(os.listdir(criu_dir)):
        path = os.path.join(criu_dir, name)
        if os.path.islink(path) or not os.path.isfile(path):
            raise ImageError(f"{path} is not a regular file: a CRI checkpoint holds CRIU's "
                             "images as flat files only")
        if hide_descriptors and name == names.RUNC_DESCRIPTORS:
            name = names.HIDDEN_DESCRIPTORS
        found.append((name, path))
    return found


def _name(member: tarfile.TarInfo) -> str:
    return archive.safe_name(member.name)


def _add_file(tar: tarfile.TarFile, name: str, path: str, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = os.path.getsize(path), 0o600, mtime
    with open(path, "rb") as f:
        tar.addfile(info, f)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o600, mtime
    tar.addfile(info, io.BytesIO(data))
