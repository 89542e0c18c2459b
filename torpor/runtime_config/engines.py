"""Drop-in configuration for the other engines: Podman, CRI-O and Kubernetes' RuntimeClass."""

from __future__ import annotations

import os

from torpor.atomicfile import write_atomic

PODMAN_DROPIN = "/etc/containers/containers.conf.d/torpor.conf"
CRIO_DROPIN = "/etc/crio/crio.conf.d/10-torpor.conf"


def podman(binary_name: str) -> str:
    return (
        "# torpor for Podman: podman --runtime torpor run ...  (or engine.runtime = \"torpor\")\n"
        "[engine.runtimes]\n"
        f'torpor = ["{binary_name}"]\n'
        "\n"
        "[engine]\n"
        'runtime_supports_json = ["crun", "runc", "kata", "runsc", "youki", "krun", "ocijail", "torpor"]\n'
    )


def crio(binary_name: str) -> str:
    return (
        "# torpor for CRI-O: Kubernetes pods with runtimeClassName: torpor\n"
        "[crio.runtime.runtimes.torpor]\n"
        f'runtime_path = "{binary_name}"\n'
        'runtime_type = "oci"\n'
        'runtime_root = "/run/runc"\n'
        'monitor_path = "/usr/libexec/crio/conmon"\n'
        'allowed_annotations = ["io.torpor."]\n'
    )


def kubernetes_runtime_class(handler: str = "torpor") -> str:
    return (
        "# RuntimeClass for pods that torpor can checkpoint: spec.runtimeClassName: torpor\n"
        "apiVersion: node.k8s.io/v1\n"
        "kind: RuntimeClass\n"
        "metadata:\n"
        f"  name: {handler}\n"
        f"handler: {handler}\n"
    )


def install_dropin(path: str, text: str) -> bool:
    """Write a drop-in file; False when it already holds exactly `text`."""
    try:
        with open(path) as f:
            if f.read() == text:
                return False
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomic(path, text.encode(), mode=0o644)
    return True
