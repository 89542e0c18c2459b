"""torpord on a test node's configuration, started and stopped by pid (tests/test_service.py,
tests/test_deadlines.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from torpor import handoff

from .containerd import Node
from .processes import wait_for


@dataclass(frozen=True)
class Host:
    """Where torpord runs when no containerd test node is (Podman's tests): its launchers and
    environment (TORPOR_CONFIG naming the node's configuration)."""
    bin_dir: Path
    env: dict[str, str]


class Torpord:
    """torpord on the node's configuration, started and stopped by pid."""

    def __init__(self, node: Node | Host, socket_path: Path, metrics_port: int,
                 log: Path) -> None:
        self.node, self.socket, self.port, self.log = node, socket_path, metrics_port, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Torpord:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(self.node.bin_dir / "torpord")], env=self.node.env,
                                         stdout=log, stderr=log, start_new_session=True)
        wait_for(lambda: handoff.connect(str(self.socket)), timeout=60, what="torpord's socket")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)

    def children(self) -> list[int]:
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def metrics_text(self) -> str:
        """/metrics once torpord has reaped every command it ran, so that each is counted: a
        command's caller has its exit status from the child itself, a moment before torpord
        reaps it and records it."""
        wait_for(lambda: not self.children(), timeout=60, what="torpord's commands reaped")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return str(r.read().decode())

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Every sample of /metrics: (name, its labels) -> value."""
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(self.metrics_text())
                for s in family.samples}

    def count(self, command: str, result: str = "success") -> float:
        return self.samples().get(("torpor_commands_total", frozenset(
            {"command": command, "result": result}.items())), 0.0)
