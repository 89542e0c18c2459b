"""torpor's local checkpoint images: OCI layouts under `[image] store`/images, one per
reference, and scratch space for checkpoints being built or restored.

    /var/lib/torpor/images/<sha256(ref)[:20]>/ref       the reference, as the user gave it
    /var/lib/torpor/images/<sha256(ref)[:20]>/layout/   an OCI image layout holding the image
    /var/lib/torpor/scratch/<random>/                   work directories, removed after use
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torpor.errors import ImageError


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

    def prepare(self, ref: str) -> Path:
        """A fresh layout directory for `ref` (replacing an older one)."""
        entry = self._entry(ref)
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(mode=0o700, parents=True)
        (entry / "ref").write_text(ref)
        return entry / "layout"

    def remove(self, ref: str) -> None:
        if not self.has(ref):
            raise ImageError(f"no local checkpoint image {ref}", hint="see `torpor ls`")
        shutil.rmtree(self._entry(ref))

    def entries(self) -> list[StoreEntry]:
        out = []
        for entry in sorted((self.root / "images").glob("*")):
            try:
                ref = (entry / "ref").read_text()
                index = json.loads((entry / "layout" / "index.json").read_text())
            except (OSError, ValueError):
                continue
            top = (index.get("manifests") or [{}])[0]
            size = sum(f.stat().st_size for f in (entry / "layout").rglob("*") if f.is_file())
            out.append(StoreEntry(ref, str(top.get("digest", "")), size, str(entry / "layout")))
        return out

    @contextmanager
    def scratch(self) -> Iterator[Path]:
        path = self.root / "scratch" / secrets.token_hex(8)
        path.mkdir(mode=0o700, parents=True)
        os.chmod(self.root / "scratch", 0o700)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
