"""Containers the tests run, and reading their state as a user would."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from .containerd import Node
from .processes import printed, wait_for

COUNTER = ("i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; "
           "mv /tmp/count.new /tmp/count; usleep 50000; done")


def task_status(node: Node, name: str) -> str:
    for line in node.ctr("tasks", "ls").stdout.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == name:
            return fields[-1]
    return "NONE"


def task_pid(node: Node, name: str) -> int:
    for line in node.ctr("tasks", "ls").stdout.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == name:
            return int(fields[1])
    raise AssertionError(f"no task {name}")


_exec_ids = iter(range(1, 1 << 30))


def exec_out(node: Node, name: str, *cmd: str, check: bool = True) -> str:
    result = node.ctr("tasks", "exec", "--exec-id", f"t{next(_exec_ids)}", name, *cmd, check=check)
    return result.stdout


def read_file(node: Node, name: str, path: str) -> str:
    """A file in the container that is never empty, read with `cat` through the shim."""
    return printed(lambda: exec_out(node, name, "cat", path))


def read_counter(node: Node, name: str) -> int:
    return int(read_file(node, name, "/tmp/count").strip())


def wait_counter_above(node: Node, name: str, value: int, timeout: float = 10) -> int:
    def above() -> int | None:
        try:
            current = read_counter(node, name)
        except (AssertionError, ValueError):
            return None
        return current if current > value else None

    result = wait_for(above, timeout=timeout, what=f"{name}'s counter to pass {value}")
    assert isinstance(result, int)
    return result


def freezer_state(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.strip().split(":", 2)
            if "freezer" in controllers.split(","):
                return Path(f"/sys/fs/cgroup/freezer{path}/freezer.state").read_text().strip()
            if controllers == "":
                events = Path(f"/sys/fs/cgroup{path}/cgroup.events").read_text()
                return "FROZEN" if "frozen 1" in events else "THAWED"
    return "UNKNOWN"


def remove(node: Node, *names: str) -> None:
    for name in names:
        node.ctr("tasks", "delete", "--force", name, check=False)
        node.ctr("containers", "delete", name, check=False)


class LineClient:
    """A TCP client holding one connection open across checkpoint and restore."""

    def __init__(self, host: str, port: int, timeout: float = 10) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.file = self.sock.makefile("rwb")

    def ask(self, line: str) -> str:
        self.file.write(line.encode() + b"\n")
        self.file.flush()
        return self.file.readline().decode().strip()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
            self.sock.close()


@contextlib.contextmanager
def containers(node: Node) -> Iterator[list[str]]:
    """Names appended to the list are removed at the end of the block."""
    names: list[str] = []
    try:
        yield names
    finally:
        remove(node, *names)


def kv_ask(node: Node, name: str, line: str, host: str = "127.0.0.1", port: int = 7000) -> str:
    """One request over a new connection, from inside the container (busybox nc waits up to 15 s
    for the answer after sending: a process CRIU has just restored, on a loaded 2-core machine,
    has been seen to take more than 5)."""
    return exec_out(node, name, "sh", "-c", f"echo '{line}' | nc -w15 {host} {port}").strip()


def wait_kv(node: Node, name: str, port: int = 7000) -> None:
    wait_for(lambda: kv_ask(node, name, "PING", port=port) == "PONG", timeout=10,
             what=f"kvserver in {name}")
    time.sleep(0)
