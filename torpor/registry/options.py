"""How to reach a registry: credentials, TLS, timeouts, retries, parallelism. Defaults live here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MIB = 1 << 20


@dataclass(frozen=True)
class RegistryOptions:
    """Options for one push or pull.

    username/password override docker's config.json; `docker_config` names another config.json.
    `ca_file` is a PEM bundle trusted for the registry's TLS certificate. `insecure` allows an
    unverified certificate and plain HTTP; loopback registries may use plain HTTP without it.
    """

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    docker_config: Path | None = None
    ca_file: Path | None = None
    insecure: bool = False
    hosts_dir: Path | None = None        # containerd's hosts.toml tree (registry/hosts.py)
    registries_conf: Path | None = None  # Podman's registries.conf, where no hosts.toml applies
    ca_files: tuple[Path, ...] = ()      # a hosts.toml's `ca`, beside ca_file
    client_certs: tuple[tuple[Path, Path | None], ...] = ()   # its `client`
    skip_verify: bool = False            # its `skip_verify`: TLS, certificate not verified
    timeout_s: float = 60.0
    retries: int = 4
    backoff_s: float = 0.5
    parallel: int = 4
    chunk_size: int = 64 * MIB          # blobs above this go in PATCH chunks of this size
    manifest_limit: int = 4 * MIB       # what distribution accepts; larger manifests are refused
    config_limit: int = 4 * MIB         # configs read into memory before layers are chosen
    # fsync each pulled blob before renaming it into place. Off by default: a pulled layout is a
    # cache whose every blob is digest-checked when it is read, and fsync of a checkpoint's
    # gigabytes of memory pages would sit on the restore's critical path (docs/registry.md).
    # index.json, the layout's commit point, is always written with fsync.
    fsync_blobs: bool = False
