"""The CUDA driver's process checkpoint API, through ctypes: the only module that touches it.

    cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
    cuCheckpointProcessGetState(int pid, CUprocessState *state)
    cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)          RUNNING -> LOCKED
    cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *)  LOCKED -> CHECKPOINTED
    cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *)        CHECKPOINTED -> LOCKED
    cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *)          LOCKED -> RUNNING

Available from driver r570 (CUDA 12.8); GPU UUID pairs on restore from r580 (CUDA 13.0), and
refused here below that. Every args struct is 64 bytes, laid out as in cuda.h, with reserved
fields zeroed. Every CUresult other than success becomes a CudaError naming the operation, the
pid and the driver's own words. pids are host pids: torpor runs in the host's pid namespace.

"CUDA process restore requires persistence mode to be enabled or cuInit to have been called
before execution" (the Driver API reference): the caller that restores calls initialize()
(cuInit(0)) first, in its own process, as CRIU's cuda plugin does. torpor-runc makes these
calls only through worker.py, in a child process that is never checkpointed itself.
"""

from __future__ import annotations

import ctypes
import enum
from ctypes import POINTER, Structure, byref, c_char_p, c_int, c_ubyte, c_uint, c_uint64

from torpor.errors import CudaError, GpuError

CUDA_SUCCESS = 0
INVALID_VALUE = 1
OUT_OF_MEMORY = 2
NOT_INITIALIZED = 3
OPERATING_SYSTEM = 304
ILLEGAL_STATE = 401
NOT_READY = 600
NOT_PERMITTED = 800
NOT_SUPPORTED = 801
# What cuCheckpointProcessGetRestoreThreadId answers for a process without CUDA: CRIU's cuda
# plugin and NVIDIA's cuda-checkpoint-helper read only these two so. Any other result is an
# error to report (CUDA_ERROR_OPERATING_SYSTEM on some setups: cuda-checkpoint issues 6, 37).
NOT_A_CUDA_PROCESS = (INVALID_VALUE, NOT_INITIALIZED)
UUID_REMAP_MIN_DRIVER = 13000  # cuDriverGetVersion of r580 (CUDA 13.0)

# CUresult names, for when the driver cannot name its own error (values from cuda.h 13.0).
RESULT_NAMES = {
    0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED", 101: "CUDA_ERROR_INVALID_DEVICE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    304: "CUDA_ERROR_OPERATING_SYSTEM", 401: "CUDA_ERROR_ILLEGAL_STATE",
    500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY", 800: "CUDA_ERROR_NOT_PERMITTED",
    801: "CUDA_ERROR_NOT_SUPPORTED", 909: "CUDA_ERROR_TIMEOUT", 999: "CUDA_ERROR_UNKNOWN",
}


class ProcessState(enum.IntEnum):
    RUNNING = 0
    LOCKED = 1
    CHECKPOINTED = 2
    FAILED = 3
    CHECKPOINTING = 4  # CUDA 13.4 custom storage only; a 580 driver never reports these two
    RESTORING = 5


class LockArgs(Structure):
    _fields_ = [("timeoutMs", c_uint), ("reserved0", c_uint), ("reserved1", c_uint64 * 7)]


class CheckpointArgs(Structure):
    _fields_ = [("reserved", c_uint64 * 8)]


class UnlockArgs(Structure):
    _fields_ = [("reserved", c_uint64 * 8)]


class Uuid(Structure):
    _fields_ = [("bytes", c_ubyte * 16)]


class GpuPair(Structure):
    _fields_ = [("oldUuid", Uuid), ("newUuid", Uuid)]


class RestoreArgs(Structure):
    """CUDA 13.0 layout; the first 12 bytes and the 64-byte size hold for every version."""

    _fields_ = [("gpuPairs", POINTER(GpuPair)), ("gpuPairsCount", c_uint),
                ("reserved", ctypes.c_char * 44), ("reserved1", c_uint64)]


def uuid_bytes(text: str) -> bytes:
    """'GPU-xxxxxxxx-xxxx-...' (NVML's form) -> the 16 raw bytes of a CUuuid."""
    hexdigits = text.removeprefix("GPU-").replace("-", "")
    raw = bytes.fromhex(hexdigits)
    if len(raw) != 16:
        raise GpuError(f"not a GPU UUID: {text!r}")
    return raw


class CudaDriver:
    """libcuda's checkpoint entry points, loaded once per process."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib = lib
        self.path = path
        for name, args in (
            ("cuInit", [c_uint]),
            ("cuDriverGetVersion", [POINTER(c_int)]),
            ("cuCheckpointProcessGetRestoreThreadId", [c_int, POINTER(c_int)]),
            ("cuCheckpointProcessGetState", [c_int, POINTER(c_int)]),
            ("cuCheckpointProcessLock", [c_int, POINTER(LockArgs)]),
            ("cuCheckpointProcessCheckpoint", [c_int, POINTER(CheckpointArgs)]),
            ("cuCheckpointProcessRestore", [c_int, POINTER(RestoreArgs)]),
            ("cuCheckpointProcessUnlock", [c_int, POINTER(UnlockArgs)]),
            ("cuGetErrorName", [c_int, POINTER(c_char_p)]),
            ("cuGetErrorString", [c_int, POINTER(c_char_p)]),
        ):
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise GpuError(f"{path} has no {name}: the CUDA checkpoint API needs driver "
                               "r570 or newer") from None
            fn.argtypes, fn.restype = args, c_int

    @classmethod
    def load(cls, path: str) -> CudaDriver:
        driver = cls.load_or_none(path)
        if driver is None:
            raise GpuError(f"cannot load the CUDA driver library {path}",
                           hint="install the NVIDIA driver, or set [gpu] cuda_library in the "
                           "torpor config")
        return driver

    @classmethod
    def load_or_none(cls, path: str) -> CudaDriver | None:
        """None when the library cannot be loaded at all (no NVIDIA driver on this node)."""
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            return None
        return cls(lib, path)

    # Results ----------------------------------------------------------------------------------

    def _describe(self, code: int) -> tuple[str, str]:
        name, text = c_char_p(), c_char_p()
        if self.lib.cuGetErrorName(code, byref(name)) != CUDA_SUCCESS or not name.value:
            return RESULT_NAMES.get(code, f"CUresult {code}"), "unknown error"
        self.lib.cuGetErrorString(code, byref(text))
        return name.value.decode(), (text.value or b"").decode()

    def _check(self, code: int, operation: str, pid: int | None) -> None:
        if code != CUDA_SUCCESS:
            name, text = self._describe(code)
            raise CudaError(operation, pid, code, name, text)

    # The API ----------------------------------------------------------------------------------

    def initialize(self) -> None:
        """cuInit(0) in this process: what a restore needs when persistence mode is off. Only
        for a short-lived caller that is never checkpointed itself (worker.py, the bench)."""
        self._check(self.lib.cuInit(0), "cuInit", None)

    def driver_version(self) -> int:
        version = c_int()
        self._check(self.lib.cuDriverGetVersion(byref(version)), "cuDriverGetVersion", None)
        return version.value

    def restore_thread(self, pid: int) -> int | None:
        """The driver's restore thread of pid; None when pid is not a CUDA process (the driver
        answers INVALID_VALUE or NOT_INITIALIZED); CudaError for any other answer."""
        tid = c_int()
        code = self.lib.cuCheckpointProcessGetRestoreThreadId(pid, byref(tid))
        if code in NOT_A_CUDA_PROCESS:
            return None
        self._check(code, "cuCheckpointProcessGetRestoreThreadId", pid)
        return tid.value

    def state(self, pid: int) -> ProcessState:
        value = c_int()
        self._check(self.lib.cuCheckpointProcessGetState(pid, byref(value)),
                    "cuCheckpointProcessGetState", pid)
        try:
            return ProcessState(value.value)
        except ValueError:
            raise GpuError(f"the driver reports an unknown checkpoint state {value.value} for "
                           f"pid {pid}") from None

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = LockArgs(timeoutMs=timeout_ms)
        self._check(self.lib.cuCheckpointProcessLock(pid, byref(args)),
                    f"cuCheckpointProcessLock (timeout {timeout_ms} ms)", pid)

    def checkpoint(self, pid: int) -> None:
        args = CheckpointArgs()
        self._check(self.lib.cuCheckpointProcessCheckpoint(pid, byref(args)),
                    "cuCheckpointProcessCheckpoint", pid)

    def restore(self, pid: int, pairs: list[tuple[str, str]] | None = None) -> None:
        """Restore onto this node's GPUs; `pairs` maps checkpointed to new GPU UUIDs (driver
        r580 or newer; None or empty: the same GPUs, the driver's default path)."""
        args = RestoreArgs()
        if pairs:
            version = self.driver_version()
            if version < UUID_REMAP_MIN_DRIVER:
                raise GpuError(f"restoring pid {pid} onto other GPUs needs driver r580 (CUDA "
                               f"13.0) or newer; this driver is CUDA {format_version(version)}")
            array = (GpuPair * len(pairs))()
            for slot, (old, new) in zip(array, pairs, strict=True):
                slot.oldUuid.bytes[:] = list(uuid_bytes(old))
                slot.newUuid.bytes[:] = list(uuid_bytes(new))
            args.gpuPairs = ctypes.cast(array, POINTER(GpuPair))
            args.gpuPairsCount = len(pairs)
        self._check(self.lib.cuCheckpointProcessRestore(pid, byref(args)),
                    "cuCheckpointProcessRestore", pid)

    def unlock(self, pid: int) -> None:
        args = UnlockArgs()
        self._check(self.lib.cuCheckpointProcessUnlock(pid, byref(args)),
                    "cuCheckpointProcessUnlock", pid)


def format_version(version: int) -> str:
    """cuDriverGetVersion's 13000 -> '13.0'."""
    return f"{version // 1000}.{version % 1000 // 10}"


_loaded: dict[str, CudaDriver | None] = {}


def try_load(path: str) -> CudaDriver | None:
    """The driver (loaded once per path), or None when this node has no CUDA driver library.
    A library without the checkpoint API (driver older than r570) raises GpuError."""
    if path not in _loaded:
        _loaded[path] = CudaDriver.load_or_none(path)
    return _loaded[path]
