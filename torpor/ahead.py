"""One call on a thread of its own, started now and waited for where its result is used: work
that only waits (a subprocess, the kernel) or that can go on beside the caller's own."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def start(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
    """`call(*args, **kwargs)` on a thread that ends with it; its Future."""
    one = ThreadPoolExecutor(1, thread_name_prefix=f"torpor-{call.__name__}")
    try:
        return one.submit(call, *args, **kwargs)
    finally:
        one.shutdown(wait=False)   # the thread ends with its one call
