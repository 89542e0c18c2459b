"""Where packaging/install-deps.sh put the ecosystem's tools, and which versions the tests use.

Everything lives in a private prefix, `$TORPOR_PREFIX/lib/torpor-deps` (TORPOR_PREFIX defaults to
/usr/local, as in the install script), and replaces nothing on PATH:

    containerd-2/bin/   containerd, ctr, containerd-shim-runc-v2 of containerd 2.x (2.1)
    containerd-2.4/bin/ the same of containerd 2.4, built from its pinned Go module
    bin/                runc 1.3.x, nerdctl, crictl, checkpointctl, cosign
    kubernetes/bin/     kubelet, kube-apiserver, kubectl, etcd, kube-controller-manager,
                        kube-scheduler and kube-proxy (the test cluster's)

Debian's containerd 1.6 and runc 1.1.5 stay on PATH; a node asks for the others by version
(`CONTAINERD_VERSIONS`, `RUNC_VERSIONS`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

PREFIX = Path(os.environ.get("TORPOR_PREFIX") or "/usr/local")
DEPS = PREFIX / "lib" / "torpor-deps"
# CRIU 4.2: install-deps.sh builds it into $TORPOR_PREFIX/sbin, which root's PATH may lack
SBIN = PREFIX / "sbin"
CONTAINERD2_BIN = DEPS / "containerd-2" / "bin"
CONTAINERD24_BIN = DEPS / "containerd-2.4" / "bin"
TOOLS_BIN = DEPS / "bin"
KUBE_BIN = DEPS / "kubernetes" / "bin"

# The names a test or `pytest --containerd/--runc` uses for each version.
CONTAINERD_VERSIONS = ("1.6", "2", "2.4")
RUNC_VERSIONS = ("1.1", "1.3")
TOOLS = ("runc", "nerdctl", "crictl", "checkpointctl", "cosign")
KUBE_TOOLS = ("kubelet", "kube-apiserver", "kubectl", "etcd", "kube-controller-manager",
              "kube-scheduler", "kube-proxy")


def containerd_bin(version: str) -> Path | None:
    """The directory of containerd, ctr and containerd-shim-runc-v2; None: Debian's, on PATH."""
    if version not in CONTAINERD_VERSIONS:
        raise ValueError(f"containerd {version!r}: choose one of {', '.join(CONTAINERD_VERSIONS)}")
    return {"1.6": None, "2": CONTAINERD2_BIN, "2.4": CONTAINERD24_BIN}[version]


def runc_path(version: str) -> Path | None:
    """runc for torpor-runc's `[runtime] path` and for plain runc; None: Debian's, on PATH."""
    if version not in RUNC_VERSIONS:
        raise ValueError(f"runc {version!r}: choose one of {', '.join(RUNC_VERSIONS)}")
    return None if version == "1.1" else TOOLS_BIN / "runc"


def tool(name: str) -> Path:
    """nerdctl, crictl, checkpointctl, cosign or runc 1.3, built by install-deps.sh."""
    if name not in TOOLS:
        raise ValueError(f"{name!r} is not one of the tools install-deps.sh builds")
    return TOOLS_BIN / name


def kube_binary(name: str) -> Path:
    """kubelet, kube-apiserver, kubectl, etcd, kube-controller-manager, kube-scheduler or
    kube-proxy, built by install-deps.sh."""
    if name not in KUBE_TOOLS:
        raise ValueError(f"{name!r} is not one of the Kubernetes binaries install-deps.sh builds")
    return KUBE_BIN / name


def search_path() -> str:
    """Where install-deps.sh puts CRIU (its build, before any other CRIU on PATH), PATH, then
    the sbin directories root's PATH may lack."""
    return ":".join([str(SBIN), os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin"])


def which(name: str) -> str | None:
    """A system tool (criu, runc, ...) as the tests and the nodes find it."""
    return shutil.which(name, path=search_path())


def missing() -> list[str]:
    """What install-deps.sh should have installed here and did not."""
    wanted = [directory / name for directory in (CONTAINERD2_BIN, CONTAINERD24_BIN)
              for name in ("containerd", "ctr", "containerd-shim-runc-v2")]
    wanted += [tool(name) for name in TOOLS]
    return [str(path) for path in wanted if not os.access(path, os.X_OK)]


def kube_missing() -> list[str]:
    """The Kubernetes binaries install-deps.sh should have built here and did not."""
    return [str(kube_binary(name)) for name in KUBE_TOOLS
            if not os.access(kube_binary(name), os.X_OK)]
