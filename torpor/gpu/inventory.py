"""GPU inventory through NVML (nvidia-ml-py, imported as pynvml): placeholder, see issue 5."""

from __future__ import annotations

from typing import Any


def gather_or_none(nvml_library: str, cuda_library: str) -> dict[str, Any] | None:
    return None


def requirements(inv: dict[str, Any] | None) -> list[Any]:
    return []
