"""torpor's configuration: every default in one place, `_SCHEMA` below.

The file is TOML, `/etc/torpor/config.toml` unless `TORPOR_CONFIG` names another; a missing
default file means all defaults. `python -m torpor.config --defaults` prints the whole file with
every key commented out at its default, which `make install` writes for a new node.

Stdlib only and no dataclasses: torpor-runc reads this on every call.
"""

from __future__ import annotations

import os

from torpor.errors import ConfigError

TYPE_CHECKING = False  # typing costs ~10 ms to import; torpor-runc's fast path avoids it
if TYPE_CHECKING:
    from typing import Any

DEFAULT_PATH = "/etc/torpor/config.toml"

# table -> key -> (type, default, what it means); the order is the order of the rendered file
_SCHEMA: dict[str, dict[str, tuple[type | tuple[type, ...], Any, str]]] = {
    "runtime": {
        "path": (str, "runc", "the low-level OCI runtime: a name on PATH or an absolute path"),
        "state_dir": (str, "/run/torpor", "per-container records torpor-runc keeps"),
        "hook_path": (str, "", "torpor-hook to write into specs; default: beside torpor-runc"),
        "log_dir": (str, "/var/log/torpor", "restored tasks' stdout and stderr, "
                    "<namespace>-<name>.log (torpor restore without --log-uri)"),
    },
    "checkpoint": {
        "volumes": ((str, list), "all",
                    'bind-mounted volumes to save: "all", "none" or a list of paths'),
        "dev_shm": (bool, True, "save a bind-mounted /dev/shm (Kubernetes style)"),
        "rootfs": (bool, True, "save the container's read-write layer inside the image dir"),
        "tcp_established": (bool, False, "defaults for checkpoints started by ctr/nerdctl"),
        "file_locks": (bool, False, ""),
        "skip_in_flight": (bool, True, "leave out connections a client opened while the "
                           "workload was frozen, not accepted yet (CRIU refuses the whole "
                           "checkpoint otherwise): a workload left running still answers them; "
                           "after a restore their clients connect again"),
        "timeout_s": (int, 300, "how long runc and CRIU may take to dump, plus 10 s per GiB "
                      "of the container's memory; then they are killed, the container runs on"),
        "network_lock": (str, "auto", 'CRIU\'s network lock during the dump and its restores: '
                         '"auto" skips it where no TCP connection is dumped (nothing for it to '
                         'hold still; its iptables calls cost ~50 ms each way) and leaves '
                         'CRIU\'s own otherwise; or "iptables", "nftables", "skip"'),
    },
    "gpu": {
        "cuda_library": (str, "libcuda.so.1", "the CUDA driver library"),
        "nvml_library": (str, "libnvidia-ml.so.1", "NVML, for the GPU inventory"),
        "lock_timeout_ms": (int, 10000, "how long a CUDA process may take to reach a lock"),
        "driver_timeout_s": (int, 60, "how long one driver call may take (checkpoint and "
                             "restore: plus 5 s per GiB held)"),
    },
    "image": {
        "store": (str, "/var/lib/torpor", "local checkpoint images (torpor ls, rm), scratch"),
        "zstd_level": (int, 1, "layer compression: 1 is fast; 3 to 19 trade time for size"),
        "signing_key": (str, "", "a PEM EC P-256 private key that signs every checkpoint this "
                        "node pushes (docs/signing.md)"),
        "encrypt_recipients": (list, [], 'recipients ("jwe:/etc/torpor/keys/nodes.pub") every '
                               "checkpoint image this node builds is encrypted for, beside "
                               "--encrypt-recipient (docs/encryption.md)"),
    },
    "restore": {
        "hooks": (list, [], "hook programs (absolute paths) a checkpoint's spec may run; "
                  "others need --allow-spec-hooks"),
        "mount_sources": (list, [], "host directories a checkpoint's bind mounts may come from; "
                          "others need --volume"),
        "devices": (list, [], 'devices beyond the defaults, "c MAJOR:MINOR" or "c MAJOR:*", '
                    'e.g. ["c 195:*"] for NVIDIA GPUs'),
        "capabilities": (list, [], 'capabilities beyond the defaults, e.g. ["CAP_SYS_PTRACE"]'),
        "host_namespaces": (list, [], "namespaces a restored container may share with the host "
                            'or join by path, e.g. ["network"]'),
        "annotations": (list, ["org.opencontainers.image.*", "io.kubernetes.cri.*",
                               "io.torpor.checkpoint.*", "nerdctl/*"],
                        "annotations a restored spec keeps (keys or prefix*; docs/security.md)"),
        "labels": (list, ["io.kubernetes.*", "org.opencontainers.image.*",
                          "io.containerd.image.config.*"],
                   "containerd labels a restored container keeps (containerd.io/restart.* and "
                   "nerdctl/* are acted on: name them only for checkpoints you trust)"),
        "allow_device_files": (bool, False, "extract device nodes and FIFOs from archives"),
        "max_layers": (int, 4096, "layers a checkpoint image may have"),
        "max_manifest_bytes": (int, 4 << 20, "size of a manifest or an index"),
        "max_config_bytes": (int, 16 << 20, "size of a checkpoint's metadata"),
        "max_unpacked_bytes": (int, 1 << 40,
                               "what a checkpoint may unpack to (and never more than is free)"),
        "max_compression_ratio": (int, 10000, "unpacked bytes per byte of layers"),
        "max_files": (int, 1000000, "entries one archive may hold"),
        "signatures": (str, "if-present", 'registry checkpoints: "required" (signed by a '
                       'trusted key or made here), "if-present" (a signature must verify) '
                       'or "off"'),
        "trusted_keys": (list, [], "PEM public keys (cosign.pub) whose signatures are trusted"),
        "decryption_keys": (list, [], "private keys, or directories of them (containerd's "
                            "/etc/containerd/ocicrypt/keys), that open encrypted checkpoints "
                            "beside --decryption-key: restore, restore on create, kube image"),
        "timeout_s": (int, 300, "how long each restore step may take (unpacking, runc and "
                      "CRIU), plus 10 s per GiB of CRIU images; then it is killed and undone"),
        "lazy": (bool, False, "restore checkpoint images lazily: the workload runs at once and "
                 "its memory arrives after it (torpor restore --lazy; docs/lazy.md)"),
        "on_create": (str, "off", 'a container created under torpor-runc from a checkpoint '
                      'image restores: "off", "signed" (only checkpoints signed by a trusted key '
                      'or made here) or "on" ([restore] signatures decides; docs/containerd.md)'),
        "max_chunk_index_bytes": (int, 256 << 20,
                                  "what a chunk index may unpack to (and never more than 32 "
                                  "times its layer, above 1 MiB)"),
    },
    "registry": {
        "docker_config": (str, "",
                          "credentials: default $DOCKER_CONFIG or ~/.docker/config.json"),
        "ca_file": (str, "", "extra CA certificates for registries with private TLS"),
        "insecure": (list, [], 'registries reached over plain http, e.g. ["localhost:5000"]'),
        "hosts_dir": (str, "/etc/containerd/certs.d",
                      "containerd's registry host configuration (<host>/hosts.toml: mirrors, "
                      'pull-through caches, CAs), as ctr and nerdctl read it; "" for none'),
        "registries_conf": (str, "/etc/containers/registries.conf",
                            "Podman's registry configuration (mirrors, locations), for "
                            'registries no hosts.toml names; "" for none'),
    },
    "service": {
        "socket": (str, "/run/torpor/torpord.sock",
                   "torpord's control socket (mode 0600, root's); the CLI hands its commands "
                   "to torpord when it answers (docs/service.md)"),
        "metrics": (str, "127.0.0.1:9477",
                    'torpord\'s Prometheus metrics, HOST:PORT; "" for none'),
    },
}


# keys whose values name files or directories on the node: absolute (a relative one would mean a
# different place for each caller's working directory); "" where "" means "none" or "default"
_ABSOLUTE_PATHS = (
    ("runtime", "state_dir"), ("runtime", "hook_path"), ("runtime", "log_dir"),
    ("image", "store"), ("image", "signing_key"), ("restore", "hooks"),
    ("restore", "mount_sources"), ("restore", "trusted_keys"), ("restore", "decryption_keys"),
    ("registry", "docker_config"),
    ("registry", "ca_file"), ("registry", "hosts_dir"),
    ("registry", "registries_conf"), ("service", "socket"),
)


NETWORK_LOCKS = ("auto", "iptables", "nftables", "skip")


class Config:
    """Typed view of the configuration file; attribute names are `<table>_<key>`."""

    __slots__ = (
        "checkpoint_dev_shm",
        "checkpoint_file_locks",
        "checkpoint_network_lock",
        "checkpoint_rootfs",
        "checkpoint_skip_in_flight",
        "checkpoint_tcp_established",
        "checkpoint_timeout_s",
        "checkpoint_volumes",
        "gpu_cuda_library",
        "gpu_driver_timeout_s",
        "gpu_lock_timeout_ms",
        "gpu_nvml_library",
        "image_encrypt_recipients",
        "image_signing_key",
        "image_store",
        "image_zstd_level",
        "path",
        "registry_ca_file",
        "registry_docker_config",
        "registry_hosts_dir",
        "registry_insecure",
        "registry_registries_conf",
        "restore_allow_device_files",
        "restore_annotations",
        "restore_capabilities",
        "restore_decryption_keys",
        "restore_devices",
        "restore_hooks",
        "restore_host_namespaces",
        "restore_labels",
        "restore_lazy",
        "restore_max_chunk_index_bytes",
        "restore_max_compression_ratio",
        "restore_max_config_bytes",
        "restore_max_files",
        "restore_max_layers",
        "restore_max_manifest_bytes",
        "restore_max_unpacked_bytes",
        "restore_mount_sources",
        "restore_on_create",
        "restore_signatures",
        "restore_timeout_s",
        "restore_trusted_keys",
        "runtime_hook_path",
        "runtime_log_dir",
        "runtime_path",
        "runtime_state_dir",
        "service_metrics",
        "service_socket",
    )

    runtime_path: str
    runtime_state_dir: str
    runtime_hook_path: str
    runtime_log_dir: str
    checkpoint_volumes: str | list[str]
    checkpoint_dev_shm: bool
    checkpoint_rootfs: bool
    checkpoint_skip_in_flight: bool
    checkpoint_network_lock: str
    checkpoint_tcp_established: bool
    checkpoint_file_locks: bool
    checkpoint_timeout_s: int
    gpu_cuda_library: str
    gpu_nvml_library: str
    gpu_lock_timeout_ms: int
    gpu_driver_timeout_s: int
    image_store: str
    image_zstd_level: int
    image_signing_key: str
    image_encrypt_recipients: list[str]
    restore_hooks: list[str]
    restore_annotations: list[str]
    restore_labels: list[str]
    restore_mount_sources: list[str]
    restore_devices: list[str]
    restore_capabilities: list[str]
    restore_host_namespaces: list[str]
    restore_allow_device_files: bool
    restore_max_layers: int
    restore_max_manifest_bytes: int
    restore_max_config_bytes: int
    restore_max_unpacked_bytes: int
    restore_max_compression_ratio: int
    restore_max_files: int
    restore_signatures: str
    restore_trusted_keys: list[str]
    restore_decryption_keys: list[str]
    restore_timeout_s: int
    restore_max_chunk_index_bytes: int
    restore_lazy: bool
    restore_on_create: str
    registry_docker_config: str
    registry_ca_file: str
    registry_insecure: list[str]
    registry_hosts_dir: str
    registry_registries_conf: str
    service_socket: str
    service_metrics: str
    path: str | None

    def __init__(self, values: dict[str, Any] | None = None, path: str | None = None) -> None:
        self.path = path
        values = values or {}
        for table, keys in _SCHEMA.items():
            given = values.get(table, {})
            if not isinstance(given, dict):
                raise ConfigError(f"{path}: [{table}] must be a table")
            unknown = sorted(set(given) - set(keys))
            if unknown:
                raise ConfigError(
                    f"{path}: unknown key(s) in [{table}]: {', '.join(unknown)}",
                    hint=f"known keys: {', '.join(sorted(keys))}",
                )
            for key, (kind, default, _) in keys.items():
                value = given.get(key, default)
                if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                    raise ConfigError(f"{path}: [{table}] {key} has the wrong type: {value!r}")
                setattr(self, f"{table}_{key}", value)
        unknown_tables = sorted(set(values) - set(_SCHEMA))
        if unknown_tables:
            raise ConfigError(f"{path}: unknown table(s): {', '.join(unknown_tables)}")
        for table, key in _ABSOLUTE_PATHS:
            value = getattr(self, f"{table}_{key}")
            for item in value if isinstance(value, list) else [value]:
                if not isinstance(item, str) or (item and not os.path.isabs(item)):
                    raise ConfigError(f"{path or 'the configuration'}: [{table}] {key} = "
                                      f"{item!r} is not an absolute path",
                                      hint="give the full path, starting with /")
        if self.checkpoint_network_lock not in NETWORK_LOCKS:
            raise ConfigError(f"{path or 'the configuration'}: [checkpoint] network_lock = "
                              f"{self.checkpoint_network_lock!r} is not one of "
                              f"{', '.join(NETWORK_LOCKS)}")
        for item in self.image_encrypt_recipients:
            if not isinstance(item, str) or not item.startswith("jwe:/"):
                raise ConfigError(f"{path or 'the configuration'}: [image] encrypt_recipients: "
                                  f"{item!r} is not jwe:/ABSOLUTE/PATH.pub",
                                  hint='e.g. encrypt_recipients = ["jwe:/etc/torpor/keys/nodes.pub"]')


def config_path() -> tuple[str, bool]:
    """The file to read and whether the user named it explicitly."""
    explicit = os.environ.get("TORPOR_CONFIG")
    if explicit:
        return explicit, True
    return DEFAULT_PATH, False


def _fast_value(text: str) -> object:
    """A plain TOML value: "string", 'string', true, false, a decimal integer, or a one-line
    list of those; ValueError for anything else (tomllib reads it)."""
    if text in ("true", "false"):
        return text == "true"
    if text[:1] in ("'", '"'):
        quote = text[0]
        inner = text[1:-1]
        if len(text) < 2 or text[-1] != quote or quote in inner or (quote == '"' and "\\" in inner):
            raise ValueError(text)
        return inner
    if text.startswith("[") and text.endswith("]"):
        body = text[1:-1].strip(" \t")
        if not body:
            return []
        items = (body[:-1] if body.endswith(",") else body).split(",")
        if any(not item.strip(" \t") for item in items):
            raise ValueError(text)  # [,] or [1,,2]
        return [_fast_value(item.strip(" \t")) for item in items]
    digits = text[1:] if text[:1] in ("-", "+") else text
    if digits.isdigit() and (digits == "0" or digits[0] != "0"):
        return int(text)
    raise ValueError(text)


def _plain_text(text: str) -> bool:
    """ASCII without control characters but tab and line ends (CR only before LF)."""
    lines = text.replace("\r\n", "\n")
    return text.isascii() and not any((c < " " and c not in "\t\n") or c == "\x7f"
                                      for c in lines)


def fast_parse(text: str) -> dict[str, Any] | None:
    """Plain config files (tables, `key = value` lines of strings, booleans, integers, lists of
    those, whole-line comments; ASCII only) read without tomllib, which costs ~10 ms with `re`
    and `typing`; None for anything else, which the real parser then reads. Where it answers,
    it answers as tomllib does (tests/unit/test_frontend_config.py)."""
    if not _plain_text(text):
        return None
    values: dict[str, Any] = {}
    table: dict[str, Any] = values
    for raw in text.replace("\r\n", "\n").split("\n"):
        line = raw.strip(" \t")
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            if not line.endswith("]") or line.startswith("[["):
                return None
            name = line[1:-1].strip(" \t")
            if not name.isidentifier() or name in values:
                return None
            table = values[name] = {}
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(" \t"), value.strip(" \t")
        if not eq or not key.replace("_", "a").isalnum() or key in table or "#" in value:
            return None
        try:
            table[key] = _fast_value(value)
        except ValueError:
            return None
    return values


def fast_runtime_path(text: str) -> tuple[str, bool] | None:
    """`[runtime] path` and whether `[restore] on_create` is other than "off", from a plain file
    (see fast_parse), for torpor-runc's pass-through."""
    values = fast_parse(text)
    if values is None:
        return None
    runtime = values.get("runtime", {})
    path = runtime.get("path", "runc") if isinstance(runtime, dict) else None
    restore = values.get("restore", {})
    on_create = restore.get("on_create", "off") if isinstance(restore, dict) else None
    if not isinstance(path, str) or not isinstance(on_create, str):
        return None
    return path, on_create != "off"


def load() -> Config:
    path, explicit = config_path()
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"TORPOR_CONFIG names {path}, which does not exist") from None
        return Config()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not valid UTF-8: {e}") from None
    values = fast_parse(text)
    if values is None:
        import tomllib  # costs ~10 ms: only for files beyond the plain subset

        try:
            values = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} is not valid TOML: {e}") from None
    return Config(values, path)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)


def render_defaults() -> str:
    """The whole configuration file, every key commented out at its default, with its meaning."""
    lines = ["# torpor's configuration (TORPOR_CONFIG or /etc/torpor/config.toml).",
             "# Every key is shown at its default; uncomment to change it.", ""]
    for table, keys in _SCHEMA.items():
        lines.append(f"[{table}]")
        for key, (_, default, meaning) in keys.items():
            setting = f"# {key} = {_toml_value(default)}"
            lines.append(f"{setting:<36}  # {meaning}" if meaning else setting)
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--defaults"]:
        sys.stderr.write("usage: python -m torpor.config --defaults\n")
        sys.exit(2)
    sys.stdout.write(render_defaults())
