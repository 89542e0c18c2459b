"""Load and flush an OCI runtime spec (config.json) as a plain dict.

The spec stays a dict so that fields torpor does not know survive untouched; it is written back
atomically (temporary file in the same directory, fsync, rename) and only when it changed.
"""

from __future__ import annotations

import os

from torpor import fastjson
from torpor.atomicfile import write_atomic
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


def flush(bundle: str, spec: Spec) -> None:
    path = spec_path(bundle)
    try:
        write_atomic(path, fastjson.dumps(spec).encode())
    except OSError as e:
        raise SpecError(f"cannot write {path}: {e.strerror}") from None
