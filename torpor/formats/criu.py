"""CRIU's options for one checkpoint, in one shape from the CLI to the saved record.

`torpor checkpoint` flags -> CriuOptions -> containerd's CheckpointOptions (torpor.containerd)
-> runc's argv, which torpor-runc reads back into CriuOptions (torpor.shim) -> state.json, from
which a restore puts back the flags containerd does not repeat on restore.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torpor.formats.fields import Fields

# runc checkpoint's boolean flags that change what CRIU dumps, and that runc restore must be
# given again for the dump to restore: containerd never passes them on restore.
RESTORE_FLAGS = ("tcp-established", "file-locks", "ext-unix-sk", "shell-job")


@dataclass(frozen=True)
class CriuOptions:
    tcp_established: bool = False
    file_locks: bool = False
    ext_unix_sk: bool = False
    shell_job: bool = False
    leave_running: bool = False
    empty_ns: tuple[str, ...] = ()
    manage_cgroups_mode: str | None = None

    @classmethod
    def from_flags(cls, present: set[str], empty_ns: list[str] | None = None,
                   manage_cgroups_mode: str | None = None) -> CriuOptions:
        """From runc's flag names (`tcp-established`, `leave-running`, ...) that are set."""
        return cls(tcp_established="tcp-established" in present,
                   file_locks="file-locks" in present, ext_unix_sk="ext-unix-sk" in present,
                   shell_job="shell-job" in present, leave_running="leave-running" in present,
                   empty_ns=tuple(empty_ns or ()), manage_cgroups_mode=manage_cgroups_mode)

    def flag_set(self, name: str) -> bool:
        return bool(getattr(self, name.replace("-", "_")))

    def restore_flags(self) -> list[str]:
        """`--tcp-established` etc.: what runc restore needs for this dump."""
        return [f"--{flag}" for flag in RESTORE_FLAGS if self.flag_set(flag)]

    def enabled(self) -> list[str]:
        """The names of the boolean options that are on, for people (inspect)."""
        return [flag for flag in (*RESTORE_FLAGS, "leave-running") if self.flag_set(flag)]

    def to_json(self) -> dict[str, Any]:
        return {"tcp_established": self.tcp_established, "file_locks": self.file_locks,
                "ext_unix_sk": self.ext_unix_sk, "shell_job": self.shell_job,
                "leave_running": self.leave_running, "empty_ns": list(self.empty_ns),
                "manage_cgroups_mode": self.manage_cgroups_mode}

    @classmethod
    def from_json(cls, f: Fields) -> CriuOptions:
        return cls(tcp_established=f.boolean("tcp_established", False),
                   file_locks=f.boolean("file_locks", False),
                   ext_unix_sk=f.boolean("ext_unix_sk", False),
                   shell_job=f.boolean("shell_job", False),
                   leave_running=f.boolean("leave_running", False),
                   empty_ns=tuple(f.strings("empty_ns")),
                   manage_cgroups_mode=f.optional_string("manage_cgroups_mode"))
