"""torpor-runc's log, in runc's own format and place.

containerd's shim passes `--log <bundle>/log.json --log-format json` and, when a runtime call
fails, reports the `msg` of the last `{"level":"error",...}` line in that file. So torpor-runc
writes its messages there, as runc-format JSON lines with an RFC 3339 `time`; with
`--log-format text` it writes runc's text format; with no `--log`, stderr. Never stdout: that is
runc's (`state`, `ps` and `features` are parsed by callers). Stdlib only.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from torpor.shim.argv import Invocation

LEVELS = ("debug", "info", "warning", "error")


def _rfc3339_now() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e9):09d}Z"


def _escape(text: str) -> str:
    # json.dumps without importing json: the fast path stays small.
    out = []
    for ch in text:
        code = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif code < 0x20:
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\u{code:04x}"))
        else:
            out.append(ch)
    return "".join(out)


def format_line(level: str, msg: str, log_format: str) -> str:
    stamp = _rfc3339_now()
    if log_format == "json":
        return f'{{"level":"{level}","msg":"{_escape(msg)}","time":"{stamp}"}}\n'
    return f'time="{stamp}" level={level} msg="{_escape(msg)}"\n'


def parse_line(line: str) -> tuple[str, str]:
    """(level, msg) of one line in runc's json or text log format; ("", "") if neither."""
    line = line.strip()
    if line.startswith("{"):
        import json

        try:
            record = json.loads(line)
        except ValueError:
            return "", ""
        if not isinstance(record, dict):
            return "", ""
        return str(record.get("level", "")), str(record.get("msg", ""))
    fields: dict[str, str] = {}
    rest = line
    while rest:
        key, eq, rest = rest.partition("=")
        if not eq:
            break
        if rest.startswith('"'):  # a quoted value, with \" and \\ escapes
            i, value = 1, []
            while i < len(rest) and rest[i] != '"':
                if rest[i] == "\\" and i + 1 < len(rest):
                    i += 1
                    value.append({"n": "\n", "t": "\t"}.get(rest[i], rest[i]))
                else:
                    value.append(rest[i])
                i += 1
            fields[key.strip()] = "".join(value)
            rest = rest[i + 1:].lstrip()
        else:
            value_text, _, rest = rest.partition(" ")
            fields[key.strip()] = value_text
    return fields.get("level", ""), fields.get("msg", "")


class RuncLog:
    """Appends lines to runc's --log file (or stderr); never raises."""

    def __init__(self, inv: Invocation | None) -> None:
        self.path = inv.global_flag("log") if inv else None
        self.format = (inv.global_flag("log-format") if inv else None) or "text"
        self.debug_enabled = bool(inv and inv.global_flags.get("debug"))

    def write(self, level: str, msg: str) -> None:
        if level == "debug" and not self.debug_enabled:
            return
        line = format_line(level, f"torpor: {msg}", self.format)
        try:
            if self.path:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
                try:
                    os.write(fd, line.encode())
                finally:
                    os.close(fd)
            else:
                sys.stderr.write(line)
                sys.stderr.flush()
        except OSError:
            pass

    def debug(self, msg: str) -> None:
        self.write("debug", msg)

    def info(self, msg: str) -> None:
        self.write("info", msg)

    def warning(self, msg: str) -> None:
        self.write("warning", msg)

    def error(self, msg: str) -> None:
        self.write("error", msg)

    def mark(self) -> int:
        """Where the log ends now: what runc writes from here on is this call's."""
        try:
            return os.stat(self.path).st_size if self.path else 0
        except OSError:
            return 0

    def runc_errors(self, since: int) -> list[str]:
        """runc's own error messages written to the log after `since` (not torpor's), in
        order: runc's fatal error, the one containerd would have shown, is the last."""
        if not self.path:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(since)
                text = f.read(1 << 20).decode(errors="replace")
        except OSError:
            return []
        found = []
        for line in text.splitlines():
            level, msg = parse_line(line)
            if level == "error" and msg and not msg.startswith("torpor:"):
                found.append(msg)
        return found
