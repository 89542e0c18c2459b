#!/usr/bin/env python3
"""A stand-in for runc that records how it was called (argv, environment, open fds, stdin,
pid) to $FAKE_RUNC_RECORD, prints $FAKE_RUNC_STDOUT and exits with $FAKE_RUNC_EXIT."""

import json
import os
import sys

fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
stdin = ""
if os.environ.get("FAKE_RUNC_READ_STDIN"):
    stdin = sys.stdin.read()
record = {"argv": sys.argv, "env": dict(os.environ), "fds": fds, "pid": os.getpid(),
          "stdin": stdin}
with open(os.environ["FAKE_RUNC_RECORD"], "w") as f:
    json.dump(record, f)
sys.stdout.write(os.environ.get("FAKE_RUNC_STDOUT", ""))
sys.stdout.flush()
sys.exit(int(os.environ.get("FAKE_RUNC_EXIT", "0")))
