"""`make demo`: the whole journey, on this machine, with real components.

A stateful container runs on node A (a private containerd in its own network namespace), a
client stores data in its memory, torpor checkpoints it and pushes the checkpoint image to a
local registry (docker-registry on 127.0.0.1), and node B (another containerd in another
network namespace) pulls it and restores the container, which goes on from where it was.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from bench.harness import IMAGE, World, world
from tests.support.containerd import Node
from tests.support.registry import Registry
from tests.support.workload import COUNTER, kv_ask, read_counter, wait_counter_above, wait_kv


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def show(command: list[str], node: Node) -> str:
    print("$ " + " ".join(command[:1] and ["torpor", *command[1:]]), flush=True)
    result = subprocess.run(command, capture_output=True, text=True, env=node.env)
    sys.stdout.write("".join(f"  {line}\n" for line in result.stderr.splitlines()))
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        raise SystemExit(f"demo: the command above failed ({result.returncode})")
    return result.stdout


def make_node(w: World, name: str) -> Node:
    config = w.base / f"{name}.toml"
    config.write_text(f'[runtime]\nstate_dir = "{w.base}/{name}-state"\n'
                      f'log_dir = "{w.base}/{name}-state-logs"\n'
                      f'[image]\nstore = "{w.base}/{name}-store"\n')
    return w.node(name, own_netns=True, config=config)


def main() -> int:
    with world() as w:
        say("starting a local registry (docker-registry) and two containerd nodes, A and B, "
            "each in its own network namespace")
        registry = Registry(w.base, "registry").start()
        try:
            a, b = make_node(w, "node-a"), make_node(w, "node-b")
            torpor = str(w.bin / "torpor")
            say("node A: a stateful container under torpor-runc "
                "(ctr run --runtime io.containerd.torpor.v2)")
            a.ctr("run", "-d", "--runtime", "io.containerd.torpor.v2", IMAGE, "web1", "sh", "-c",
                  f"kvserver 7000 & {COUNTER}")
            wait_kv(a, "web1")
            for line in ("SET user alice", "SET cart 3-books", "INCR visits", "INCR visits"):
                print(f"client> {line:18s} server> {kv_ask(a, 'web1', line)}")
            count = wait_counter_above(a, "web1", 20)
            print(f"web1's counter, in its memory: {count}")

            ref = f"{registry.host}/demo/web1:ckpt-1"
            say(f"node A: checkpoint web1 and push it to {ref}")
            show([torpor, "checkpoint", "web1", "-t", ref, "--push"], a)
            checkpointed_at = count
            say("what the image holds (read from the registry's metadata, no layer downloaded)")
            show([torpor, "inspect", ref], b)

            say("node B: pull and restore it")
            started = time.monotonic()
            show([torpor, "restore", ref], b)
            print(f"(restore took {time.monotonic() - started:.2f}s)")
            say("node B: the state carried over")
            for line in ("GET user", "GET cart", "INCR visits"):
                print(f"client> {line:18s} server> {kv_ask(b, 'web1', line)}")
            resumed = read_counter(b, "web1")
            time.sleep(0.5)
            later = read_counter(b, "web1")
            print(f"web1's counter on B: {resumed} right after the restore (A checkpointed near "
                  f"{checkpointed_at}), {later} half a second later")
            ok = kv_ask(b, "web1", "GET user") == "alice" and later > resumed >= checkpointed_at
            info = json.loads(subprocess.run([torpor, "inspect", ref, "--json"], env=b.env,
                                             capture_output=True, text=True).stdout)
            print(f"\nimage {info['digest']}: {len(info['layers'])} layers, node "
                  f"{info['node']['kernel']} with CRIU {info['node']['criu_version']}")
            say("done: the memory, the open server and the counter moved from A to B" if ok
                else "the state did not carry over as expected")
            return 0 if ok else 1
        finally:
            registry.stop()


if __name__ == "__main__":
    sys.exit(main())
