"""torpord's worth: a 64 MiB checkpoint -o DIR and its restore with the service running (the
CLI's commands and torpor-runc's checkpoint handed to it), with the service stopped (the CLI and
torpor-runc in their own processes, as on a node without torpord) and with bare runc, in one run.
torpord is started before each round's "service" mode and stopped before its "in-process" one:
torpor-runc, run by containerd's shim, finds the service through the node's configuration, not
through the CLI's environment.

The bare runc baseline runs twice: as runc runs CRIU by default (an iptables network lock on
the dump and the restore), and with CRIU told what torpor-runc tells it where no TCP
connection is dumped (`network-lock skip`), so that the gain of that choice shows apart.

The containers hold `memhog`'s dirty, incompressible memory; each checkpoint is
`--leave-running` (so that one container serves every round) to a new directory, each restore
a new container, removed after. Medians of the wall times from the user's shell, round 0 thrown
away (the page cache's first touch); the orders alternate between rounds.

    python -m bench.service [--mib 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.checkpoint import bare_bundle, become_subreaper, runc, start
from bench.harness import World, world
from tests.support.containerd import Node
from tests.support.processes import wait_for
from torpor import handoff

MODES = ("service", "in-process", "runc", "runc-nolock")


def torpor(w: World, node: Node, env: dict[str, str], *args: str) -> float:
    t = time.perf_counter()
    result = subprocess.run([str(w.bin / "torpor"), *args], env={**node.env, **env},
                            capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if result.returncode != 0:
        raise SystemExit(f"torpor {' '.join(args)} failed:\n{result.stderr}")
    return elapsed


def one_round(w: World, node: Node, mode: str, i: int, base: Path) -> tuple[float, float]:
    ck = base / f"{mode}-ck-{i}"
    if mode.startswith("runc"):
        # runc-nolock: bare runc told what torpor-runc tells CRIU where no TCP connection is
        # dumped ([checkpoint] network_lock = "auto"): no iptables lock on dump and restore
        env = {"CRIU_CONFIG_FILE": str(nolock_config(base))} if mode == "runc-nolock" else None
        checkpoint = runc(node, "checkpoint", "--leave-running", "--image-path", str(ck),
                          "--work-path", str(base / f"work-{mode}-{i}"), "r", env=env)
        new = f"{mode}-{i}"
        bundle = bare_bundle(node, "r", new, base / f"bundle-{mode}-{i}")
        restore = runc(node, "restore", "--detach", "--image-path", str(ck), "--work-path",
                       str(base / f"rwork-{mode}-{i}"), "--bundle", str(bundle), "--pid-file",
                       str(bundle / "pid"), new, env=env)
        pid = int((bundle / "pid").read_text())
        runc(node, "kill", new, "KILL")
        os.waitpid(pid, 0)  # ours: we are the subreaper of what runc restored
        runc(node, "delete", "--force", new)
    else:
        env = {"TORPOR_NO_SERVICE": "1"} if mode == "in-process" else {}
        new = f"t-{mode}-{i}"
        checkpoint = torpor(w, node, env, "checkpoint", "t", "-o", str(ck), "--leave-running",
                            "--volumes", "none")
        restore = torpor(w, node, env, "restore", str(ck), "--name", new, "--volume", "/gap")
        node.ctr("tasks", "delete", "--force", new)
        node.ctr("containers", "rm", new)
    shutil.rmtree(ck, ignore_errors=True)
    return checkpoint * 1000, restore * 1000


def nolock_config(base: Path) -> Path:
    path = base / "criu-nolock.conf"
    if not path.exists():
        path.write_text("network-lock skip\n")
    return path


def stop(service: subprocess.Popen[bytes]) -> None:
    os.kill(service.pid, signal.SIGTERM)
    service.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    become_subreaper()
    with world() as w:
        sock = w.base / "torpord.sock"
        w.config.write_text(w.config.read_text()
                            + f'[service]\nsocket = "{sock}"\nmetrics = ""\n')
        node = w.node("svc")
        base = w.base / "service-bench"
        start(node, "t", args.mib, base / "gap-t", ["--runtime", "io.containerd.torpor.v2"],
              gap=False)
        start(node, "r", args.mib, base / "gap-r", ["--runtime", "io.containerd.runc.v2"],
              gap=False)
        service: subprocess.Popen[bytes] | None = None
        try:
            times: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
            for i in range(args.rounds + 1):
                for mode in MODES if i % 2 else tuple(reversed(MODES)):
                    if mode == "service" and service is None:
                        service = subprocess.Popen([str(w.bin / "torpord")], env=node.env,
                                                   stderr=subprocess.DEVNULL,
                                                   start_new_session=True)
                        wait_for(lambda: handoff.connect(str(sock)), timeout=60, what="torpord")
                    elif mode == "in-process" and service is not None:
                        stop(service)
                        service = None
                    measured = one_round(w, node, mode, i, base)
                    if i > 0:
                        times[mode].append(measured)
        finally:
            if service is not None:
                stop(service)
        for name in ("t", "r"):
            node.ctr("tasks", "delete", "--force", name)
            node.ctr("containers", "rm", name)
    ck = {m: statistics.median(t[0] for t in times[m]) for m in MODES}
    rs = {m: statistics.median(t[1] for t in times[m]) for m in MODES}
    for what, figures in (("checkpoint -o", ck), ("restore", rs)):
        print(f"{args.mib} MiB {what:<13} service {figures['service']:6.0f} ms  in-process "
              f"{figures['in-process']:6.0f} ms  runc {figures['runc']:6.0f} ms | service/runc "
              f"{figures['service'] / figures['runc']:.2f}  in-process/runc "
              f"{figures['in-process'] / figures['runc']:.2f}  service/in-process "
              f"{figures['service'] / figures['in-process']:.2f} | runc without CRIU's network "
              f"lock {figures['runc-nolock']:6.0f} ms, service/that "
              f"{figures['service'] / figures['runc-nolock']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
