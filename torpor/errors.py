"""torpor's exceptions: one tree, each with a message a user can act on and an exit code.

    TorporError                      exit 1
    ├── ConfigError                  exit 2   bad /etc/torpor/config.toml, bad option value
    ├── SpecError                    exit 2   config.json cannot be read or written
    ├── RuntimeNotFound              exit 127 the low-level runtime (runc) is missing
    ├── ContainerdError              exit 1   containerd refused or could not be reached
    │   ├── NotFound                          no such container, task, image, content
    │   └── AlreadyExists                     a container or image of that name exists
    ├── CheckpointError              exit 1   a checkpoint step failed (the workload keeps running)
    │   └── CriuError                         CRIU's own reason, with the log it came from
    ├── RestoreError                 exit 1   a restore step failed (nothing is left behind)
    ├── DeadlineExceeded             exit 1   a step overran its deadline ([restore]/[checkpoint]
    │                                         timeout_s); what it ran was killed and undone
    ├── NetworkError                 exit 1   capturing or applying network configuration
    ├── FormatError                  exit 1   a file torpor reads is malformed or of an unknown version
    ├── ImageError                   exit 1   a checkpoint image or layout is malformed
    │   ├── DigestMismatch                    a blob is not what its descriptor says
    │   ├── UnsafeArchive                     an archive entry would escape its target
    │   └── DecryptionError                   an encrypted layer cannot be opened: no key, none of
    │                                         the keys given, or its ciphertext was altered
    ├── RegistryError                exit 1   an OCI registry refused a request
    │   └── AuthError                         credentials are missing or rejected
    ├── IncompatibleNode             exit 3   this node cannot restore the checkpoint (lists why)
    ├── KubeError                    exit 1   the Kubernetes API (through kubectl) refused a step
    │                                         of a migration; the source pod keeps running
    └── GpuError                     exit 1   the CUDA driver or NVML refused an operation
        └── CudaError                         a CUresult other than success, with its name

Foreign exceptions (grpc.RpcError, pyroute2's NetlinkError, HTTP errors, ctypes results) are
translated into these at the one module that talks to that boundary. This module imports only
the standard library: torpor-runc's fast path may import it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~10 ms to import; torpor-runc's fast path avoids it
if TYPE_CHECKING:
    from collections.abc import Sequence


class TorporError(Exception):
    """Base of every error torpor raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} ({self.hint})"
        return self.message


class ConfigError(TorporError):
    exit_code = 2


class SpecError(TorporError):
    exit_code = 2


class RuntimeNotFound(TorporError):
    exit_code = 127


class ContainerdError(TorporError):
    pass


class NotFound(ContainerdError):
    pass


class AlreadyExists(ContainerdError):
    pass


class CheckpointError(TorporError):
    pass


class CriuError(CheckpointError):
    def __init__(self, message: str, *, log_path: str | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.log_path = log_path
        self.runtime_output = b""   # what runc printed, passed on after torpor's reason


class RestoreError(TorporError):
    pass


class DeadlineExceeded(TorporError):
    pass


class NetworkError(TorporError):
    pass


class FormatError(TorporError):
    pass


class ImageError(TorporError):
    pass


class DigestMismatch(ImageError):
    pass


class UnsafeArchive(ImageError):
    pass


class DecryptionError(ImageError):
    pass


class RegistryError(TorporError):
    def __init__(self, message: str, *, status: int | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.status = status


class AuthError(RegistryError):
    pass


class IncompatibleNode(TorporError):
    """The node cannot restore a checkpoint; `mismatches` lists every reason."""

    exit_code = 3

    def __init__(self, mismatches: Sequence[str]) -> None:
        self.mismatches = list(mismatches)
        lines = "\n".join(f"  - {m}" for m in self.mismatches)
        super().__init__(f"this node cannot restore the checkpoint:\n{lines}")


class KubeError(TorporError):
    pass


class GpuError(TorporError):
    pass


class CudaError(GpuError):
    def __init__(self, operation: str, pid: int | None, code: int, name: str, text: str) -> None:
        who = f" for pid {pid}" if pid is not None else ""
        super().__init__(f"{operation}{who} failed: {name} ({code}): {text}")
        self.operation = operation
        self.pid = pid
        self.code = code
        self.name = name
        self.text = text
