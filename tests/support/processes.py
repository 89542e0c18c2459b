"""Start, wait for and stop processes the tests own: always by pid, never by name."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any


def wait_for(condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.05,
             what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def printed(read: Callable[[], str], tries: int = 3) -> str:
    """What `read` printed: an exec, through containerd's runc shim, of a command whose output
    is never empty (a counter's file). Asked again when it printed nothing: the shim gives an
    exec's output 2 s to be copied before it lets the exec go, and drops what is left
    (containerd#12289, fixed after 2.1), which a machine running two suites at once sees."""
    for _ in range(tries - 1):
        out = read()
        if out.strip():
            return out
    return read()


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, the process we started."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


@contextlib.contextmanager
def reaped(*procs: subprocess.Popen[Any], timeout: float = 60.0
           ) -> Iterator[list[subprocess.Popen[Any]]]:
    """The processes we started (these, and those the block adds to the list it is given) have
    ended and are reaped when the block ends, however it ends: one still running then (a test
    that failed midway) is SIGKILLed, by its Popen, and reaped. One the block waited for
    itself is left as it was."""
    started = list(procs)
    try:
        yield started
    finally:
        running = [proc for proc in started if proc.poll() is None]
        for proc in running:
            proc.kill()
        for proc in running:
            proc.communicate(timeout=timeout)


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat from its third field on (state, ppid, ...): what follows the command
    name, which may hold spaces and parentheses itself."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.rfind(")") + 2:].split()


def parent_of(pid: int) -> int:
    return int(stat_fields(pid)[1])


def cpu_seconds(pid: int) -> float:
    """The CPU time `pid` has used so far, user and system."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pids_with_arg(arg: str) -> list[int]:
    """Pids whose command line holds `arg` exactly (e.g. our private containerd's socket)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if arg.encode() in args:
            found.append(int(entry))
    return found


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
