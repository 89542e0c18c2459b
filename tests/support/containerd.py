"""A private containerd: temporary root, state and socket, its own namespace, killed by pid.

Each test session gets its own instance (two of them, each in its own network namespace, stand
for two nodes). The containerd config is written from `torpor runtime-config containerd`, and the
instance's PATH starts with the directory that holds torpor's launchers, so that
`ctr run --runtime io.containerd.torpor.v2` finds `containerd-shim-torpor-v2`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from torpor.runtime_config import containerd as containerd_config

from .netns import NetNS
from .processes import kill_pid, pids_with_arg, stop, wait_for

CONFIG = """\
version = 2
root = "{root}/root"
state = "{root}/state"
disabled_plugins = [{disabled}]

[grpc]
  address = "{root}/containerd.sock"

[ttrpc]
  address = "{root}/containerd.sock.ttrpc"

[debug]
  address = "{root}/debug.sock"
  level = "info"

[metrics]
  address = ""
"""

NON_CRI_DISABLED = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]


class Node:
    """One containerd daemon the test session owns."""

    def __init__(self, base: Path, name: str, bin_dir: Path, torpor_config: Path,
                 netns: NetNS | None = None, cri: bool = False,
                 extra_env: dict[str, str] | None = None) -> None:
        self.name = name
        self.root = base / name
        self.bin_dir = bin_dir
        self.torpor_config = torpor_config
        self.netns = netns
        self.cri = cri
        self.address = str(self.root / "containerd.sock")
        self.namespace = f"torpor-{os.getpid()}-{name}"
        self.config_path = self.root / "config.toml"
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_env = dict(extra_env or {})

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        env["TORPOR_CONFIG"] = str(self.torpor_config)
        env["CONTAINERD_ADDRESS"] = self.address
        env["CONTAINERD_NAMESPACE"] = self.namespace
        # containerd extracts restored checkpoints into temporary directories it never removes
        env["XDG_RUNTIME_DIR"] = str(self.root / "xdg")
        env.pop("TORPOR_RUNC_LOWLEVEL", None)
        env.update(self.extra_env)
        return env

    def start(self) -> Node:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "xdg").mkdir(mode=0o700, exist_ok=True)
        disabled = [p for p in NON_CRI_DISABLED if not (self.cri and p.endswith(".cri"))]
        self.config_path.write_text(CONFIG.format(
            root=self.root, disabled=", ".join(f'"{p}"' for p in disabled)))
        containerd_config.install(str(self.config_path), str(self.bin_dir / "torpor-runc"))
        cmd = ["containerd", "--config", str(self.config_path)]
        if self.netns is not None:
            # nsenter, not `ip netns exec`: that also remounts /sys, hiding the cgroup mounts
            cmd = ["nsenter", f"--net={self.netns.path}", *cmd]
        log = open(self.root / "containerd.log", "wb")
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_for(lambda: self.ctr("version", check=False).returncode == 0, timeout=30,
                 what=f"containerd {self.name} to answer on {self.address}")
        return self

    def ctr(self, *args: str, check: bool = True, timeout: float = 120,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = ["ctr", "--address", self.address, "--namespace", self.namespace, *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                input=input, env=self.env)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n"
                                 f"{result.stdout}{result.stderr}")
        return result

    def log_text(self) -> str:
        try:
            return (self.root / "containerd.log").read_text(errors="replace")
        except OSError:
            return ""

    # Clean-up ---------------------------------------------------------------------------------

    def remove_all(self) -> None:
        """Kill and delete every task and container in this node's namespace."""
        for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            self.ctr("tasks", "delete", "--force", task, check=False)
        for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("containers", "delete", container, check=False)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.remove_all()
            except Exception:
                pass
            stop(self.proc)
        # Shims started through this daemon carry its socket in their argv: ours to end.
        for pid in pids_with_arg(self.address):
            kill_pid(pid)
        time.sleep(0.1)
        unmount_under(self.root)
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(f"/run/containerd/runc/{self.namespace}", ignore_errors=True)


def unmount_under(root: Path) -> None:
    """Unmount everything mounted below `root`, deepest first."""
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
