"""`make demo`: a private containerd with the torpor runtime, a container run under torpor-runc."""

from __future__ import annotations

import json
import sys

from bench.harness import IMAGE, world


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def main() -> int:
    with world() as w:
        say("starting a private containerd (node A) with the torpor runtime class")
        a = w.node("a")
        print(a.config_path.read_text().split("[plugins", 1)[-1].join(["[plugins", ""]))
        say("running a container with `ctr run --runtime io.containerd.torpor.v2`")
        a.ctr("run", "-d", "--runtime", "io.containerd.torpor.v2", IMAGE, "demo",
              "sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; usleep 100000; done")
        print(a.ctr("tasks", "ls").stdout)
        record = w.state_dir / "containers" / a.namespace / "demo" / "container.json"
        say(f"torpor-hook's record of it: {record}")
        data = json.loads(record.read_text())
        print(json.dumps({k: data[k] for k in ("id", "pid", "netns", "gpu_devices")}, indent=2))
        count = a.ctr("tasks", "exec", "--exec-id", "peek", "demo", "cat", "/tmp/count").stdout
        print(f"the container's counter: {count.strip()}")
        a.ctr("tasks", "delete", "--force", "demo")
        a.ctr("containers", "delete", "demo")
        say("done: the container ran under torpor-runc and was cleaned up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
