"""A private containerd: temporary root, state and socket, its own namespace, killed by pid.

Each test session gets its own instance (two of them, each in its own network namespace, stand
for two nodes). The containerd config is written from `torpor runtime-config containerd`, and the
instance's PATH starts with the directory that holds torpor's launchers, so that
`ctr run --runtime io.containerd.torpor.v2` finds `containerd-shim-torpor-v2`.

A node runs Debian's containerd 1.6 (config version 2) or containerd 2.x (config version 3,
from `containerd_bin`), and Debian's runc 1.1.5 or another runc (`runc`): that one becomes
torpor-runc's low-level runtime (`[runtime] path` in the node's own torpor config) and the
`runc` on the node's PATH, which plain `io.containerd.runc.v2` containers use.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import tomllib
from pathlib import Path

import tomlkit

from torpor.runtime_config import containerd as containerd_config

from . import ecosystem
from .netns import NetNS
from .processes import kill_pid, pids_with_arg, stop, wait_for

CTR_DEPRECATION = re.compile(r'time="[^"]*" level=warning msg="DEPRECATION: The support for '
                             r'cgroup v1 is deprecated')

CONFIG = """\
version = {version}
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
# 2.x splits CRI into three plugins, and its NRI plugin listens on a machine-wide socket
CRI_PLUGINS_V3 = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime",
                  "io.containerd.cri.v1.images"]
ALWAYS_DISABLED_V3 = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.erofs",
                      "io.containerd.differ.v1.erofs", "io.containerd.snapshotter.v1.blockfile"]

# What the CRI plugin needs on these machines: no CAP_SYS_RESOURCE for oom_score_adj below the
# daemon's, and CNI configuration of the node's own (none until a test writes one).
CRI_CONFIG = {
    2: """
[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{root}/cni/net.d"
""",
    3: """
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{root}/cni/net.d"
""",
}


def containerd_major(containerd: str) -> int:
    """1 or 2, from `containerd --version` ("containerd github.com/containerd/containerd/v2 2.1.9")."""
    out = subprocess.run([containerd, "--version"], capture_output=True, text=True,
                         check=True).stdout.split()
    return int(out[2].lstrip("v").split(".")[0])


class Node:
    """One containerd daemon the test session owns."""

    def __init__(self, base: Path, name: str, bin_dir: Path, torpor_config: Path,
                 netns: NetNS | None = None, cri: bool = False,
                 extra_env: dict[str, str] | None = None, containerd_bin: Path | None = None,
                 runc: Path | None = None, torpor_runtime: bool = True,
                 decryption_keys: Path | None = None) -> None:
        """`containerd_bin`: the directory of another containerd, ctr and shim (default: PATH);
        `runc`: the low-level runtime for torpor-runc and plain runc (default: runc on PATH);
        `torpor_runtime`: the runtime class torpor in its config (`torpor check` tests go
        without); `decryption_keys`: a directory of private keys, with which torpor-decoder
        decrypts encrypted layers as containerd pulls them (`torpor runtime-config containerd
        --decryption-keys`)."""
        self.name = name
        self.root = base / name
        self.bin_dir = bin_dir
        self.containerd_bin = containerd_bin
        self.containerd = str(containerd_bin / "containerd") if containerd_bin else "containerd"
        self.ctr_path = str(containerd_bin / "ctr") if containerd_bin else "ctr"
        self.major = containerd_major(self.containerd)
        self.config_version = 3 if self.major >= 2 else 2
        self.runc = runc
        self.torpor_config = torpor_config
        if runc is not None:
            self.torpor_config = self.root / "torpor.toml"
            self._base_torpor_config = torpor_config
        self.netns = netns
        self.cri = cri
        self.address = str(self.root / "containerd.sock")
        self.namespace = f"torpor-{os.getpid()}-{name}"
        self.config_path = self.root / "config.toml"
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_env = dict(extra_env or {})
        self.torpor_runtime = torpor_runtime
        self.decryption_keys = decryption_keys

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        front = [str(self.bin_dir)]
        if self.runc is not None:
            front.append(str(self.root / "runc-bin"))
        if self.containerd_bin is not None:
            front.append(str(self.containerd_bin))
        env["PATH"] = ":".join([*front, str(ecosystem.SBIN),
                                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
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
        if self.runc is not None:
            self._use_runc(self.runc)
        self.config_path.write_text(self._config_text())
        if self.torpor_runtime:
            containerd_config.install(str(self.config_path), str(self.bin_dir / "torpor-runc"),
                                      decryption_keys=str(self.decryption_keys)
                                      if self.decryption_keys else None)
        cmd = [self.containerd, "--config", str(self.config_path)]
        if self.netns is not None:
            # nsenter, not `ip netns exec`: that also remounts /sys, hiding the cgroup mounts
            cmd = ["nsenter", f"--net={self.netns.path}", *cmd]
        log = open(self.root / "containerd.log", "wb")
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_for(lambda: self.ctr("version", check=False).returncode == 0, timeout=30,
                 what=f"containerd {self.name} to answer on {self.address}")
        return self

    def _config_text(self) -> str:
        if self.config_version == 2:
            disabled = [p for p in NON_CRI_DISABLED if not (self.cri and p.endswith(".cri"))]
        else:
            disabled = [p for p in NON_CRI_DISABLED if p not in CRI_PLUGINS_V3]
            disabled += ALWAYS_DISABLED_V3 + ([] if self.cri else CRI_PLUGINS_V3)
        text = CONFIG.format(version=self.config_version, root=self.root,
                             disabled=", ".join(f'"{p}"' for p in disabled))
        if self.cri:
            (self.root / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
            text += CRI_CONFIG[self.config_version].format(root=self.root)
        return text

    def _use_runc(self, runc: Path) -> None:
        """torpor-runc's low-level runtime and the node's plain `runc` become `runc`."""
        config = tomllib.loads(self._base_torpor_config.read_text())
        config.setdefault("runtime", {})["path"] = str(runc)
        self.torpor_config.write_text(tomlkit.dumps(config))
        runc_bin = self.root / "runc-bin"
        runc_bin.mkdir(exist_ok=True)
        link = runc_bin / "runc"
        if not link.is_symlink():
            link.symlink_to(runc)

    def ctr(self, *args: str, check: bool = True, timeout: float = 120,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [self.ctr_path, "--address", self.address, "--namespace", self.namespace, *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                input=input, env=self.env)
        # ctr 2.2+ warns on every call that cgroup v1 is deprecated (this machine's kernel
        # mounts v1): ctr's own words, not the container's stderr
        result.stderr = "".join(line for line in result.stderr.splitlines(keepends=True)
                                if not CTR_DEPRECATION.match(line))
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
