"""Driver calls under torpor's own deadline, so that a hung NVIDIA driver never hangs containerd.

Of the CUDA checkpoint calls only the lock takes a timeout; a state query blocks while the
driver's restore thread cannot run, and NVML can hang on a GPU in trouble. So torpor-runc
never calls the driver in its own process: a worker it forks on first use makes every call,
one at a time, and answers over a pipe, and torpor-runc waits for each answer until a
deadline:

    restore thread, state, unlock, cuInit, driver version, NVML   [gpu] driver_timeout_s
    lock                                                     that + [gpu] lock_timeout_ms
    checkpoint, restore                                      that + 5 s per GiB it holds

A call past its deadline (or a worker that dies): the worker is killed with SIGKILL (a call
stuck inside the kernel driver ends when the driver lets it; torpor does not wait for that),
DriverTimeout names the call, and the next call starts a new worker. What the lost call did
is unknown; session.py asks the driver again and, when that fails too, reports the process's
GPU state as unknown instead of guessing.

An answer that comes after its caller gave up waiting for another reason (a signal) is read
and dropped by the next call, which waits for its own: calls never overlap in the driver.
The worker ignores SIGTERM and SIGINT (it finishes the call it is in), holds no descriptor but
its two pipes (never containerd's), and exits when torpor-runc closes its end.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

from torpor.capture import deadlines
from torpor.errors import CudaError, GpuError
from torpor.formats.fields import Fields
from torpor.formats.gpu import GpuInventory

SECONDS_PER_GIB = 5.0  # checkpoint and restore: 0.2 GB/s, a third of CRIUgpu's 0.7 GB/s (H100)
# a restore whose host memory arrives lazily reads it at the page source's pace: the lazy
# restore's own allowance, not the driver's
LAZY_SECONDS_PER_GIB = deadlines.PER_GIB_S


class DriverTimeout(GpuError):
    """A driver call that did not answer within torpor's deadline (or whose worker died)."""

    def __init__(self, message: str, operation: str, pid: int | None) -> None:
        super().__init__(message)
        self.operation = operation
        self.pid = pid


OPERATIONS = {  # op -> the driver's name for it, for messages
    "restore_thread": "cuCheckpointProcessGetRestoreThreadId",
    "state": "cuCheckpointProcessGetState", "lock": "cuCheckpointProcessLock",
    "checkpoint": "cuCheckpointProcessCheckpoint", "restore": "cuCheckpointProcessRestore",
    "unlock": "cuCheckpointProcessUnlock", "initialize": "cuInit",
    "driver_version": "cuDriverGetVersion", "inventory": "NVML (the GPU inventory)",
    "mps_clients": "NVML (MPS clients)",
}


def _serve(requests: int, answers: int, cuda_library: str, nvml_library: str) -> None:
    """The worker: one request line in, one answer line out, until the pipe closes."""
    from torpor.gpu import cuda, inventory

    driver: cuda.CudaDriver | None = None
    buffer = b""
    while True:
        chunk = os.read(requests, 65536)
        if not chunk:
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            request = json.loads(line)
            op, args = request["op"], request["args"]
            answer: dict[str, Any] = {"id": request["id"]}
            try:
                if op == "inventory":
                    found = inventory.gather_or_none(nvml_library, cuda_library, args[0])
                    answer["ok"] = found.to_json() if found is not None else None
                elif op == "mps_clients":
                    answer["ok"] = inventory.mps_clients(nvml_library, args[0])
                else:
                    driver = driver or cuda.CudaDriver.load(cuda_library)
                    value = getattr(driver, op)(*args)
                    answer["ok"] = int(value) if value is not None else None
            except CudaError as e:
                answer["cuda"] = [e.operation, e.pid, e.code, e.name, e.text]
            except GpuError as e:
                answer["gpu"] = [e.message, e.hint]
            except Exception as e:
                answer["gpu"] = [f"{OPERATIONS.get(op, op)} failed: {type(e).__name__}: {e}",
                                 None]
            data = json.dumps(answer).encode() + b"\n"
            while data:
                data = data[os.write(answers, data):]


def _child_main(requests: int, answers: int, cuda_library: str, nvml_library: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = {0, 1, 2, requests, answers}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    code = 0
    try:
        _serve(requests, answers, cuda_library, nvml_library)
    except BaseException:
        code = 1
    os._exit(code)


class DriverWorker:
    """Bounded driver calls for one torpor-runc operation (see the module docstring).

    `on_call(worker_pid, deadline)` is told before each call (torpor-runc tells its guardian,
    which waits for an unfinished call before it undoes anything); `deadline` is a
    time.monotonic() value, comparable across processes."""

    def __init__(self, cuda_library: str, nvml_library: str, timeout_s: float,
                 lock_timeout_ms: int = 10000,
                 on_call: Callable[[int, float], None] = lambda pid, deadline: None) -> None:
        self.cuda_library = cuda_library
        self.nvml_library = nvml_library
        self.timeout_s = float(timeout_s)
        self.lock_timeout_ms = lock_timeout_ms
        self.on_call = on_call
        self.pid = 0
        self.initialized = False  # cuInit ran in the current worker
        self._requests = self._answers = -1
        self._buffer = b""
        self._next_id = 0
        self._busy_until = 0.0  # an unanswered call of this worker runs until then at most

    # The worker process -------------------------------------------------------------------

    def _start(self) -> None:
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(requests_w)
            os.close(answers_r)
            _child_main(requests_r, answers_w, self.cuda_library, self.nvml_library)
        os.close(requests_r)
        os.close(answers_w)
        for fd in (requests_w, answers_r):
            os.set_inheritable(fd, False)
        self.pid, self._requests, self._answers = pid, requests_w, answers_r
        self._buffer, self._busy_until, self.initialized = b"", 0.0, False

    def _kill(self) -> None:
        if not self.pid:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._reap(wait=False)

    def _reap(self, wait: bool) -> None:
        for fd in (self._requests, self._answers):
            if fd >= 0:
                os.close(fd)
        self._requests = self._answers = -1
        try:
            os.waitpid(self.pid, 0 if wait else os.WNOHANG)
        except ChildProcessError:
            pass
        self.pid = 0

    def close(self) -> None:
        """End the worker: it exits once the call it is in (if any) is answered."""
        if self.pid:
            busy = self._busy_until > time.monotonic()
            self._reap(wait=not busy)

    # Calls ----------------------------------------------------------------------------------

    def call(self, op: str, *args: Any, timeout: float | None = None, pid: int | None = None
             ) -> Any:
        """Run `op` in the worker; its value, or CudaError, GpuError, DriverTimeout."""
        if not self.pid:
            self._start()
        limit = self.timeout_s if timeout is None else timeout
        deadline = max(self._busy_until, time.monotonic()) + limit
        self._next_id += 1
        ident = self._next_id
        self.on_call(self.pid, deadline)
        data = json.dumps({"id": ident, "op": op, "args": list(args)}).encode() + b"\n"
        try:
            while data:
                data = data[os.write(self._requests, data):]
        except OSError:
            self._kill()
            raise DriverTimeout(f"the GPU driver worker died before {OPERATIONS.get(op, op)}"
                                + (f" for pid {pid}" if pid is not None else ""),
                                OPERATIONS.get(op, op), pid) from None
        self._busy_until = deadline
        answer = self._wait(ident, deadline, op, pid, limit)
        self._busy_until = 0.0
        return self._result(answer)

    def _wait(self, ident: int, deadline: float, op: str, pid: int | None,
              limit: float) -> dict[str, Any]:
        name = OPERATIONS.get(op, op)
        who = f" for pid {pid}" if pid is not None else ""
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                answer = json.loads(line)
                if answer.get("id") == ident:
                    return dict(answer)
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                raise DriverTimeout(
                    f"the NVIDIA driver did not answer {name}{who} within {limit:g} s; "
                    "torpor gave up on the call (its worker was killed)", name, pid)
            ready, _, _ = select.select([self._answers], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._answers, 65536)
            if not chunk:
                self._kill()
                raise DriverTimeout(f"the GPU driver worker died during {name}{who}", name, pid)
            self._buffer += chunk

    @staticmethod
    def _result(answer: dict[str, Any]) -> Any:
        if "cuda" in answer:
            operation, pid, code, name, text = answer["cuda"]
            raise CudaError(operation, pid, code, name, text)
        if "gpu" in answer:
            message, hint = answer["gpu"]
            raise GpuError(message, hint=hint)
        return answer.get("ok")

    # The driver's calls, bounded --------------------------------------------------------------

    def restore_thread(self, pid: int) -> int | None:
        """The driver's restore thread of pid; None when pid is not a CUDA process."""
        value = self.call("restore_thread", pid, pid=pid)
        return int(value) if value is not None else None

    def state(self, pid: int) -> int:
        return int(self.call("state", pid, pid=pid))

    def lock(self, pid: int, timeout_ms: int) -> None:
        self.call("lock", pid, timeout_ms, pid=pid,
                  timeout=self.timeout_s + timeout_ms / 1000)

    def checkpoint(self, pid: int, held_bytes: int = 0) -> None:
        self.call("checkpoint", pid, pid=pid, timeout=self._copy_time(held_bytes))

    def restore(self, pid: int, pairs: Sequence[tuple[str, str]] | None = None,
                held_bytes: int = 0, lazy: bool = False) -> None:
        if not self.initialized:
            self.initialize()
        self.call("restore", pid, [list(p) for p in pairs] if pairs else None, pid=pid,
                  timeout=self._copy_time(held_bytes,
                                          LAZY_SECONDS_PER_GIB if lazy else SECONDS_PER_GIB))

    def unlock(self, pid: int) -> None:
        self.call("unlock", pid, pid=pid)

    def initialize(self) -> None:
        """cuInit(0) in the worker: a restore needs it unless persistence mode is on."""
        self.call("initialize")
        self.initialized = True

    def driver_version(self) -> int:
        return int(self.call("driver_version"))

    def inventory(self, pids: Sequence[int] = ()) -> GpuInventory | None:
        found = self.call("inventory", list(pids))
        return GpuInventory.from_json(Fields(found, "the GPU inventory")) if found else None

    def mps_clients(self, pids: Sequence[int]) -> list[int]:
        return [int(p) for p in self.call("mps_clients", list(pids))]

    def _copy_time(self, held_bytes: int, per_gib: float = SECONDS_PER_GIB) -> float:
        return self.timeout_s + per_gib * held_bytes / (1 << 30)
