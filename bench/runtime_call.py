"""What one runtime call costs torpor-runc's front end, with `[restore] on_create` off and on.

The shim runs `torpor-runc create` and `start` for every container; with on_create on, the front
end also reads the bundle's config.json (create) or stats one file (start). This times the
front end alone, its runtime `/bin/true`, against `/bin/true` itself, interleaved, with a spec of
the size ctr writes: the difference between "off" and "signed" is what the check costs.

    python -m bench.runtime_call [--runs 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from torpor.runtime_config import launchers

CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
        "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]
SPEC = {"ociVersion": "1.1.0", "root": {"path": "rootfs"},
        "process": {"args": ["sleep", "600"], "cwd": "/", "env": ["PATH=/usr/bin:/bin"],
                    "capabilities": {k: CAPS for k in ("bounding", "effective", "permitted")}},
        "mounts": [{"destination": f"/m{i}", "type": "tmpfs", "source": "tmpfs",
                    "options": ["nosuid", "strictatime", "mode=755"]} for i in range(12)],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]}}


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env)
    os.waitpid(pid, 0)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torpor-bench-") as tmp:
        base = Path(tmp)
        launchers.install(str(base / "bin"), str(base / "lib"), python=sys.executable)
        (base / "bundle").mkdir()
        (base / "bundle" / "config.json").write_text(json.dumps(SPEC))
        for mode in ("off", "signed"):
            (base / f"{mode}.toml").write_text(f'[runtime]\npath = "/bin/true"\n'
                                               f'[restore]\non_create = "{mode}"\n')
        runc = str(base / "bin" / "torpor-runc")
        calls = {"create": [runc, "--root", str(base / "root"), "create", "--bundle",
                            str(base / "bundle"), "--pid-file", str(base / "init.pid"), "c1"],
                 "start": [runc, "--root", str(base / "root"), "start", "c1"]}
        times: dict[tuple[str, str], list[float]] = {
            (mode, call): [] for mode in ("off", "signed") for call in calls}
        bare = []
        for i in range(args.runs):
            for mode in (("off", "signed") if i % 2 else ("signed", "off")):
                env = {"TORPOR_CONFIG": str(base / f"{mode}.toml"), "PATH": "/usr/bin:/bin"}
                for call, argv in calls.items():
                    times[(mode, call)].append(timed(argv, env))
            bare.append(timed(["/bin/true"], {}))
    print(f"{args.runs} runs each, interleaved; spec {len(json.dumps(SPEC))} bytes")
    print(f"  /bin/true alone:            median {statistics.median(bare) * 1e6:6.0f} us")
    for (mode, call), values in times.items():
        print(f"  torpor-runc {call:6s} {mode:6s}:  median {statistics.median(values) * 1e6:6.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
