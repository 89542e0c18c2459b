"""Deadlines for the steps of a checkpoint and a restore, and the end of what overstays one.

A step that runs a program (torpor-runc running runc, which starts CRIU in swrk mode as its
child, in its process group; CRIU's action scripts and the tasks it restores are CRIU's
children) waits for it with `wait`: past the deadline the program and everything it started
are stopped (SIGSTOP: none of them forks again), then killed (SIGKILL). They are found from the
child torpor started, by parentage, never by name; the cgroup of a half-restored container is
runc's to empty (`runc delete --force`), not torpor's: a checkpoint's spec names it. A step
that runs in this process (unpacking) runs under `step`: SIGALRM breaks what blocks it (a FIFO
where a file should be), in the main thread.

Each deadline is a base from the configuration plus PER_GIB_S per GiB of what the step
handles (CRIU's images, the container's memory), so large workloads are not cut short.

Stdlib only: torpor-runc imports it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

from torpor.errors import DeadlineExceeded

PER_GIB_S = 10.0
GIB = 1 << 30
TICK_S = 0.05


def budget(base_s: float, size_bytes: int = 0) -> float:
    """The deadline of a step that handles `size_bytes`: the base, plus PER_GIB_S per GiB."""
    return float(base_s) + PER_GIB_S * max(size_bytes, 0) / GIB


def tree_bytes(path: str) -> int:
    """The size of the files under `path` (CRIU's images)."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def wait(proc: subprocess.Popen[bytes], limit_s: float, held: Callable[[], bool] | None = None,
         output: bool = False) -> tuple[bytes, bytes] | None:
    """Wait for `proc` (its stdout and stderr when `output`, else empty): None when it was not
    done within `limit_s`, then it and everything it started are killed and reaped. While
    `held()` is true the clock stands (someone else decides how long that lasts); it starts
    again, from zero, when `held()` is false again."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            if output:
                out, err = proc.communicate(timeout=TICK_S)
                return out or b"", err or b""
            proc.wait(timeout=TICK_S)
            return b"", b""
        except subprocess.TimeoutExpired:
            pass
        if held is not None and held():
            deadline = time.monotonic() + limit_s
        elif time.monotonic() >= deadline:
            kill_tree(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=10)
            return None


def kill_tree(root: int) -> list[int]:
    """SIGKILL `root` (a child of this process) and everything below it, stopped first so that
    none forks meanwhile; the pids killed."""
    stopped: list[int] = []
    for _ in range(50):  # until a pass finds no process it had not stopped yet
        found = [p for p in [root, *descendants(root)]
                 if p not in stopped and p not in (os.getpid(), os.getppid(), 1)]
        if not found:
            break
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
    for pid in stopped:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return stopped


def descendants(root: int) -> list[int]:
    """The pids below `root`, by their parent in /proc, parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(0), []):
            if child not in out and child != root:
                out.append(child)
                todo.append(child)
    return out


@contextlib.contextmanager
def step(what: str, limit_s: float, setting: str) -> Iterator[None]:
    """Run the block within `limit_s`, or raise DeadlineExceeded naming the step and the
    `setting` that sets it. In the main thread only (elsewhere the block runs unbounded)."""
    if limit_s <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise DeadlineExceeded(f"{what} did not finish within {limit_s:.0f}s",
                               hint=f"raise {setting} if it needs longer")

    previous = signal.signal(signal.SIGALRM, expired)
    left, _ = signal.setitimer(signal.ITIMER_REAL, limit_s)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if left:  # an outer step's clock goes on
            signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - started), 0.001))


@contextlib.contextmanager
def step_from_arm(what: str, limit_s: float, setting: str) -> Iterator[Callable[[], None]]:
    """As `step`, but the clock starts only when the block calls the function it is given
    (from any thread): a rebuild beside a download is timed from the download's end."""
    if limit_s <= 0 or threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return

    def expired(signum: int, frame: object) -> None:
        raise DeadlineExceeded(f"{what} did not finish within {limit_s:.0f}s",
                               hint=f"raise {setting} if it needs longer")

    def arm() -> None:
        signal.setitimer(signal.ITIMER_REAL, limit_s)

    previous = signal.signal(signal.SIGALRM, expired)
    left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
    started = time.monotonic()
    try:
        yield arm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if left:  # an outer step's clock goes on
            signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - started), 0.001))


def memory_bytes(pid: int) -> int:
    """What the memory cgroup of `pid` (a container's init) uses; 0 when unknown."""
    if pid <= 0:
        return 0
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            path = os.path.join("/sys/fs/cgroup/memory", parts[2].lstrip("/"),
                                "memory.usage_in_bytes")
        elif parts[0] == "0" and not parts[1]:
            path = os.path.join("/sys/fs/cgroup", parts[2].lstrip("/"), "memory.current")
        else:
            continue
        try:
            with open(path) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            continue
    return 0


def remove_criu_yards(work_dir: str | None) -> list[str]:
    """Unmount and remove the cgroup yards (`.criu.cgyard.*`: every cgroup hierarchy, mounted)
    that a killed CRIU left in its work directory, where it would have unmounted them itself;
    the mount points removed."""
    if not work_dir:
        return []
    return unmount_under(os.path.join(os.path.realpath(work_dir), ".criu.cgyard."))


def unmount_under(prefix: str) -> list[str]:
    """Detach every mount whose mount point starts with `prefix` (deepest first) and remove
    the mount points left empty: what a killed runc or CRIU mounted for one call."""
    try:
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4].replace("\\040", " ") for line in f]
    except OSError:
        return []
    ours = sorted({p for p in points if p.startswith(prefix)}, key=len, reverse=True)
    if not ours:
        return []
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for point in ours:
        libc.umount2(point.encode(), 2)  # MNT_DETACH
    for point in ours:
        with contextlib.suppress(OSError):
            os.rmdir(point)
    return ours
