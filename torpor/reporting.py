"""How the library tells its caller what it is doing, without knowing who the caller is.

`Progress` is what every operation (torpor.ops) takes: `step` for a line a person reads
("checkpointing the task"), `transfer` for a byte counter of a long upload or download (None
when nobody draws one). The CLI passes a terminal reporter, tests and other callers pass
`SILENT`. `Log` is torpor-runc's log (runc's --log file, as JSON lines) as the capture and GPU
code see it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

# (bytes done, bytes in all), from any worker thread, one call at a time
ByteProgress = Callable[[int, int], None]


class Progress(Protocol):
    def step(self, message: str) -> None: ...

    def transfer(self, label: str) -> ByteProgress | None: ...


class Silent:
    def step(self, message: str) -> None:
        pass

    def transfer(self, label: str) -> ByteProgress | None:
        return None


SILENT = Silent()


class Log(Protocol):
    def debug(self, msg: str) -> None: ...

    def info(self, msg: str) -> None: ...

    def warning(self, msg: str) -> None: ...

    def error(self, msg: str) -> None: ...
