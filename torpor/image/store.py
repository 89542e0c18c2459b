"""torpor's local checkpoint images: OCI layouts under `[image] store`/images, one per
reference, and scratch space for checkpoints being built or restored.

    /var/lib/torpor/images/<sha256(ref)[:20]>/ref          the reference, as the user gave it
    /var/lib/torpor/images/<sha256(ref)[:20]>/layout       -> versions/<v>, the current layout
    /var/lib/torpor/images/<sha256(ref)[:20]>/versions/<v>/  OCI image layouts
    /var/lib/torpor/scratch/<name>/                         work directories, removed after use

An entry changes only by writing a new version beside the current one and switching the
`layout` link to it (a rename: readers see the old layout or the new, whole): a pull, a
checkpoint or an import that fails leaves the previous copy exactly as it was. Versions no
link names (left by a crash) are removed by `sweep`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torpor import held_dirs
from torpor.atomicfile import write_atomic
from torpor.durable import sync_dir
from torpor.errors import ImageError

VERSIONS = "versions"
WRITERS = ".writers.lock"
SCRATCH = "op-"   # an operation's scratch directory: op-<token>, locked while it lives
SWITCH = ".switch.lock"


@dataclass(frozen=True)
class StoreEntry:
    ref: str
    digest: str       # the image index's digest
    size: int         # bytes on disk
    layout: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Store:
    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def _entry(self, ref: str) -> Path:
        return self.root / "images" / hashlib.sha256(ref.encode()).hexdigest()[:20]

    def layout(self, ref: str) -> Path:
        return self._entry(ref) / "layout"

    def has(self, ref: str) -> bool:
        entry = self._entry(ref)
        try:
            return (entry / "ref").read_text() == ref and (entry / "layout" / "index.json").exists()
        except OSError:
            return False

    @contextmanager
    def staging(self, ref: str) -> Iterator[Path]:
        """A new, empty layout directory for `ref`, beside its current one: it becomes the
        entry when the block ends (atomically replacing the previous one); on an exception
        it is removed and the previous entry is left as it was."""
        entry = self._open_entry(ref)
        with _locked(entry, WRITERS, fcntl.LOCK_SH):
            version = entry / VERSIONS / secrets.token_hex(8)
            version.mkdir(mode=0o700, parents=True)
            try:
                yield version
                self._switch(entry, version)
            except BaseException:
                shutil.rmtree(version, ignore_errors=True)
                self._drop_if_empty(entry)
                raise

    def install(self, ref: str, layout: Path) -> Path:
        """Make the complete layout at `layout` (in this store's scratch space) the entry of
        `ref`, atomically; returns its new path."""
        entry = self._open_entry(ref)
        with _locked(entry, WRITERS, fcntl.LOCK_SH):
            version = entry / VERSIONS / secrets.token_hex(8)
            version.parent.mkdir(mode=0o700, exist_ok=True)
            try:
                os.rename(layout, version)
                sync_dir(str(version.parent))
                self._switch(entry, version)
            except BaseException:
                if version.exists():
                    shutil.rmtree(version, ignore_errors=True)
                self._drop_if_empty(entry)
                raise
        return entry / "layout"

    def prepare(self, ref: str) -> Path:
        """A fresh layout directory for `ref`, replacing an older one at once. Prefer
        `staging`, which keeps the older one until the new one is whole."""
        entry = self._entry(ref)
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(mode=0o700, parents=True)
        (entry / "ref").write_text(ref)
        return entry / "layout"

    def remove(self, ref: str) -> None:
        if not self.has(ref):
            raise ImageError(f"no local checkpoint image {ref}", hint="see `torpor ls`")
        shutil.rmtree(self._entry(ref))

    def layouts(self) -> list[tuple[str, Path]]:
        """(reference, layout directory) of every image, without reading the layouts."""
        out = []
        for entry in sorted((self.root / "images").glob("*")):
            try:
                ref = (entry / "ref").read_text()
            except OSError:
                continue
            if (entry / "layout" / "index.json").exists():
                out.append((ref, entry / "layout"))
        return out

    def find_blob(self, digest: str, size: int) -> Path | None:
        """A file of some image's layout holding the blob `digest` of `size` bytes (not hashed
        here: whoever reads it checks it), so that it is linked, not fetched or written again."""
        hex_part = digest.split(":", 1)[-1]
        for _, layout in self.layouts():
            path = layout / "blobs" / "sha256" / hex_part
            try:
                if path.stat().st_size == size:
                    return path
            except OSError:
                continue
        return None

    def entries(self) -> list[StoreEntry]:
        out = []
        for entry in sorted((self.root / "images").glob("*")):
            try:
                ref = (entry / "ref").read_text()
                index = json.loads((entry / "layout" / "index.json").read_text())
            except (OSError, ValueError):
                continue
            top = (index.get("manifests") or [{}])[0]
            layout = (entry / "layout").resolve()
            size = sum(f.stat().st_size for f in layout.rglob("*") if f.is_file())
            out.append(StoreEntry(ref, str(top.get("digest", "")), size, str(entry / "layout")))
        return out

    @contextmanager
    def downloading(self, digest: str, waiting: Callable[[str], None] = lambda _: None
                    ) -> Iterator[None]:
        """One download of the image `digest` at a time on this node: restores and pulls of
        one image started together wait for the first, whose layers they then find in the
        store (`waiting` is told so, in words, if they wait). The lock file goes with its holder: a
        waiter that wakes on a removed one takes the lock again on the new file."""
        locks = self.root / "locks"
        locks.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = locks / f"download-{digest.split(':', 1)[-1]}.lock"
        told = False
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not told:
                    waiting("waiting for the download of this image by another restore or "
                            "pull on this node")
                    told = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.fstat(fd).st_ino == os.stat(path).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)   # its holder removed it after we opened it: take the new one
        try:
            yield
        finally:
            path.unlink(missing_ok=True)
            os.close(fd)

    @contextmanager
    def scratch(self) -> Iterator[Path]:
        """A scratch directory for one operation, removed at its end. It is locked while the
        operation lives, so that `sweep` removes what a killed one left (a lazy restore's kept
        packs, a pull's layers: gigabytes) and nothing another still uses."""
        (self.root / "scratch").mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root / "scratch", 0o700)
        path = self.root / "scratch" / f"{SCRATCH}{secrets.token_hex(8)}"
        fd = held_dirs.make(str(path.parent), path.name)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
            os.close(fd)

    def scratch_dir(self, name: str) -> Path:
        """A new scratch directory of that name (the caller removes it)."""
        (self.root / "scratch").mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root / "scratch", 0o700)
        path = self.root / "scratch" / name
        path.mkdir(mode=0o700)
        return path

    def sweep(self) -> list[str]:
        """Remove versions that no entry's link names, entries left without a layout (both
        left by a crash mid-change) and scratch directories no live operation holds; what was
        removed."""
        removed = []
        for path in sorted((self.root / "scratch").glob(f"{SCRATCH}*")):
            if not held_dirs.abandoned(str(path)):
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
        for entry in sorted((self.root / "images").glob("*")):
            with _locked(entry, WRITERS, fcntl.LOCK_EX | fcntl.LOCK_NB) as fd:
                if fd is None:
                    continue  # someone is writing a version now
                current = _current(entry)
                for version in sorted((entry / VERSIONS).glob("*")):
                    if version.name != current:
                        shutil.rmtree(version, ignore_errors=True)
                        removed.append(str(version))
                if current is None and not (entry / "layout").exists():
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(str(entry))
        return removed

    # Changing an entry -----------------------------------------------------------------------

    def _open_entry(self, ref: str) -> Path:
        entry = self._entry(ref)
        entry.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not (entry / "ref").exists():
            write_atomic(str(entry / "ref"), ref.encode(), mode=0o600)
        return entry

    def _switch(self, entry: Path, version: Path) -> None:
        """Point entry/layout at `version` (one rename), then remove what it pointed at."""
        with _locked(entry, SWITCH, fcntl.LOCK_EX):
            link = entry / "layout"
            old: Path | None = None
            if link.is_symlink():
                old = entry / VERSIONS / os.path.basename(os.readlink(link))
            elif link.exists():  # an entry written by an older torpor: a plain directory
                old = entry / VERSIONS / f"old-{secrets.token_hex(4)}"
                os.rename(link, old)
            tmp = entry / f".layout-{secrets.token_hex(4)}"
            os.symlink(f"{VERSIONS}/{version.name}", tmp)
            os.rename(tmp, link)
            sync_dir(str(entry))  # the switch on disk before the old version goes
            if old is not None and old != version:
                shutil.rmtree(old, ignore_errors=True)

    def _drop_if_empty(self, entry: Path) -> None:
        """A first version that failed: leave no entry behind."""
        if not (entry / "layout").exists() and not any((entry / VERSIONS).glob("*")):
            shutil.rmtree(entry, ignore_errors=True)


def _current(entry: Path) -> str | None:
    link = entry / "layout"
    return os.path.basename(os.readlink(link)) if link.is_symlink() else None


@contextmanager
def _locked(entry: Path, name: str, operation: int) -> Iterator[int | None]:
    """An flock on one of the entry's lock files: WRITERS, shared by those writing a version
    and exclusive for a sweep; SWITCH, so that two writers switch one after the other. Yields
    None when LOCK_NB was asked and someone holds it."""
    try:
        fd = os.open(entry / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            yield None
            return
        yield fd
    finally:
        os.close(fd)
