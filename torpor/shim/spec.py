"""Load and flush an OCI runtime spec (config.json) as a plain dict.

The spec stays a dict so that fields torpor does not know survive untouched; it is written back
atomically (temporary file in the same directory, fsync, rename) and only when it changed.
"""

from __future__ import annotations

import os

from torpor import fastjson
from torpor.errors import SpecError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Spec = dict[str, Any]


def spec_path(bundle: str) -> str:
    return os.path.join(bundle, "config.json")


def load(bundle: str) -> Spec:
    path = spec_path(bundle)
    try:
        with open(path, "rb") as f:
            spec = fastjson.loads(f.read())
    except FileNotFoundError:
        raise SpecError(f"{path} does not exist", hint="is --bundle right?") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise SpecError(f"{path} is not valid JSON: {e}") from None
    except OSError as e:
        raise SpecError(f"cannot read {path}: {e.strerror}") from None
    if not isinstance(spec, dict):
        raise SpecError(f"{path} is not a JSON object")
    return spec


def write_atomic(path: str, data: bytes, mode: int | None = None) -> None:
    """Write `data` to `path` so that readers see the old or the new file, never a mix."""
    directory = os.path.dirname(os.path.abspath(path))
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    tmp = os.path.join(directory, f".{os.path.basename(path)}.torpor-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)


def flush(bundle: str, spec: Spec) -> None:
    path = spec_path(bundle)
    try:
        write_atomic(path, fastjson.dumps(spec).encode())
    except OSError as e:
        raise SpecError(f"cannot write {path}: {e.strerror}") from None
