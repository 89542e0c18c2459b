"""What a checkpoint records about its node, and what a restore node is compared against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torpor.formats.fields import Fields


@dataclass(frozen=True)
class NodeFacts:
    architecture: str
    kernel: str
    criu_version: str
    runc_version: str
    cgroup_version: int
    cpu_flags: tuple[str, ...] = ()
    nvidia_driver: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "kernel": self.kernel,
                "criu_version": self.criu_version, "runc_version": self.runc_version,
                "cgroup_version": self.cgroup_version, "cpu_flags": list(self.cpu_flags),
                "nvidia_driver": self.nvidia_driver}

    @classmethod
    def from_json(cls, f: Fields) -> NodeFacts:
        return cls(architecture=f.string("architecture", ""), kernel=f.string("kernel", ""),
                   criu_version=f.string("criu_version", "unknown"),
                   runc_version=f.string("runc_version", "unknown"),
                   cgroup_version=f.integer("cgroup_version", 0),
                   cpu_flags=tuple(f.strings("cpu_flags")),
                   nvidia_driver=f.optional_string("nvidia_driver"))


@dataclass(frozen=True)
class Requirement:
    """One line of `torpor check`: a requirement, ok | warn | fail | skip, and what to do."""

    name: str
    status: str
    detail: str
    fix: str = ""           # the command (or step) that fixes a failure

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}
