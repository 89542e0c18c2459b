"""Download one blob into a layout: streamed to a temporary file, renamed into place only when its
size and digest are what the descriptor says.

The temporary file sits beside its final name (`blobs/sha256/.<hex>.<random>.partial`, 0600)
and is removed on any failure, so a failed download leaves nothing. A dropped connection (an
error, or a body that ends before its Content-Length) resumes from the bytes already received
and hashed, with `Range: bytes=<offset>-`; a registry that answers 200 instead of 206 is read
from the start. A body longer or shorter than the descriptor's size is an error.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from torpor.errors import ImageError
from torpor.formats.digests import new_hasher, verify_hasher
from torpor.formats.oci import Descriptor
from torpor.registry.client import RepositoryClient
from torpor.registry.http_errors import TransientError
from torpor.registry.layout import Layout
from torpor.registry.transport import backoff_delays, sleep


def download_blob(repo: RepositoryClient, blob: Descriptor, layout: Layout,
                  report: Callable[[int], None], durable: bool,
                  growing: Callable[[str, int], None] | None = None) -> Path:
    """Fetch `blob` from `repo` into `layout`; returns its path. DigestMismatch or ImageError
    (truncated, too long) when the registry's content is not the descriptor's. `growing(path,
    size)` is told each time the temporary file holds more (written through, readable)."""
    final = layout.blob_path(blob.digest)
    fd, name = tempfile.mkstemp(prefix=f".{final.name[:16]}.", suffix=".partial",
                                dir=layout.blob_dir(blob.digest))
    partial = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            if growing is not None:
                growing(name, 0)   # begun: a connection that hangs before its first MiB shows
                told = report

                def report(size: int) -> None:
                    out.flush()
                    growing(name, size)
                    told(size)
            _fetch_into(repo, blob, out, report)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return final


def _fetch_into(repo: RepositoryClient, blob: Descriptor, out: BinaryIO,
                report: Callable[[int], None]) -> None:
    what = f"blob {blob.digest} of {repo.repository}"
    delays = backoff_delays(repo.session.options)
    hasher, written = new_hasher(blob.digest), 0
    while True:
        try:
            response = repo.open_blob(blob.digest, written)
            if response.status == 200 and written:
                out.seek(0)
                out.truncate()
                hasher, written = new_hasher(blob.digest), 0   # a reader of it reads short
            declared = response.header("Content-Length")
            end = written + int(declared) if declared and declared.isdigit() else None
            if end is not None and end > blob.size:
                response.discard()
                raise _too_long(what, end, blob.size)
            for chunk in response.iter_chunks():
                if written + len(chunk) > blob.size:
                    response.discard()
                    raise _too_long(what, written + len(chunk), blob.size)
                out.write(chunk)
                hasher.update(chunk)
                written += len(chunk)
                report(written)
            response.close()
            if end is not None and written < end:  # the connection dropped mid-body
                raise TransientError(f"the connection to the registry dropped during {what} "
                                     f"after {written} of {blob.size} bytes")
            break
        except TransientError:
            delay = next(delays, None)
            if delay is None:
                raise
            report(written)   # a download told to stop (registry/arrivals.py) stops here
            sleep(delay)
    if written != blob.size:
        raise ImageError(f"{what} is truncated: the registry sent {written} of {blob.size} bytes",
                         hint="the registry's copy is damaged; push the checkpoint again")
    verify_hasher(hasher, blob.digest, what)


def _too_long(what: str, size: int, expected: int) -> ImageError:
    return ImageError(f"{what} is at least {size} bytes on the registry, its descriptor says {expected}",
                      hint="the registry holds other content than the manifest names; nothing was kept")
