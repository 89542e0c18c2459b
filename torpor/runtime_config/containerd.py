"""The containerd runtime class `torpor`, for config version 2 (containerd 1.6/1.7) and 3 (2.x).

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.torpor]      # version 2
      runtime_type = "io.containerd.runc.v2"
      pod_annotations = ["io.torpor.*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.torpor.options]
        BinaryName = "/usr/local/bin/torpor-runc"

Version 3 keys the same table under `plugins."io.containerd.cri.v1.runtime"`. Clients that pick a
runtime by name rather than by class (`ctr run --runtime`, `nerdctl run --runtime`) use
`io.containerd.torpor.v2`, served by the `containerd-shim-torpor-v2` launcher; the runtime class
is for Kubernetes (RuntimeClass handler `torpor`) and every other CRI client.

With a directory of decryption keys (`--decryption-keys DIR`, containerd's own is
/etc/containerd/ocicrypt/keys), the config also names torpor-decoder (beside torpor-runc) as the
stream processor of encrypted layers, in the two tables containerd hands a layer's keys to
(torpor/image/stream_decoder.py): a node then pulls and runs the images torpor encrypts for it,
through the CRI plugin (Kubernetes) as through ctr. On containerd 2.x (config version 3) the CRI
plugin must then pull images itself (`use_local_image_pull = true`): its default, the transfer
service, hands no keys to a stream processor, so it cannot unpack an encrypted layer.

`install` merges these into an existing config.toml with tomlkit, so the user's comments, order
and other settings stay as they were, after writing a backup beside it.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import tomlkit
from tomlkit.items import Table

from torpor.atomicfile import write_atomic
from torpor.errors import ConfigError

RUNTIME_NAME = "torpor"
SHIM_RUNTIME = "io.containerd.torpor.v2"
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
CRI_IMAGES = "io.containerd.cri.v1.images"     # version 3
DECODER = "io.containerd.ocicrypt.decoder.v1"
_LAYER = "application/vnd.oci.image.layer.v1.tar"


def decoder_tables(decoder: str, keys_dir: str) -> dict[str, dict[str, Any]]:
    """The stream processors of encrypted layers: torpor-decoder with the node's keys."""
    args = ["--decryption-keys-path", keys_dir]
    return {
        f"{DECODER}.tar": {"accepts": [f"{_LAYER}+encrypted", f"{_LAYER}+zstd+encrypted"],
                           "returns": _LAYER, "path": decoder, "args": [*args, "--decompress"]},
        f"{DECODER}.tar.gzip": {"accepts": [f"{_LAYER}+gzip+encrypted"],
                                "returns": f"{_LAYER}+gzip", "path": decoder, "args": args},
    }


def _set_decoder(doc: tomlkit.TOMLDocument, decoder: str, keys_dir: str, version: int) -> bool:
    """torpor-decoder's stream processors into `doc`; True when something changed."""
    changed = False
    if version == 3:
        images = _child(_child(doc, "plugins"), CRI_IMAGES)
        if images.get("use_local_image_pull") is not True:
            images["use_local_image_pull"] = True
            changed = True
    processors = _child(doc, "stream_processors")
    for name, wanted in decoder_tables(decoder, keys_dir).items():
        current = processors.get(name)
        if current is not None and {k: current.get(k) for k in wanted} == wanted:
            continue
        other = str(current.get("path", "")) if current is not None else ""
        if other and os.path.basename(other) != "torpor-decoder" and shutil.which(other):
            raise ConfigError(
                f"stream processor {name} is {other}, installed on this node: torpor-decoder "
                "would replace it, and images encrypted for its other key schemes (pkcs7, pgp, "
                "key providers) would no longer run",
                hint="keep it (it decrypts what torpor encrypts, but for tar+zstd+encrypted "
                "layers add that type to the .tar table's accepts), or remove it from the "
                "config first (docs/encryption.md)")
        table = tomlkit.table()
        for key, value in wanted.items():
            table.add(key, value)
        if current is not None:
            processors[name] = table
        else:
            processors.add(name, table)
        changed = True
    return changed


def decoder_beside(binary_name: str) -> str:
    return os.path.join(os.path.dirname(binary_name), "torpor-decoder")


VERIFIERS = "io.containerd.image-verifier.v1.bindir"
VERIFIERS_DIR = "/opt/containerd/image-verifier/bin"


def image_verifiers(path: str) -> list[str]:
    """The image verifiers containerd's config at `path` runs on a transfer-service pull
    (its bindir plugin's programs): a CRI plugin that pulls itself skips them."""
    import tomllib

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return []
    plugin = (doc.get("plugins") or {}).get(VERIFIERS) or {}
    directory = str(plugin.get("bin_dir") or VERIFIERS_DIR)
    try:
        return sorted(os.path.join(directory, n) for n in os.listdir(directory))
    except OSError:
        return []


def runtime_table(binary_name: str, runtime_options: dict[str, Any] | None = None) -> Table:
    table = tomlkit.table()
    table.add("runtime_type", "io.containerd.runc.v2")
    table.add("pod_annotations", ["io.torpor.*"])
    options = tomlkit.table()
    options.add("BinaryName", binary_name)
    for key, value in (runtime_options or {}).items():
        options.add(key, value)
    table.add("options", options)
    return table


def document(binary_name: str, version: int = 2) -> tomlkit.TOMLDocument:
    if version not in CRI_PLUGIN:
        raise ConfigError(f"containerd config version {version} is not supported (use 2 or 3)")
    doc = tomlkit.document()
    doc.add(tomlkit.comment(f"torpor runtime class for containerd (config version {version})."))
    doc.add(tomlkit.comment(f"ctr/nerdctl: --runtime {SHIM_RUNTIME}; Kubernetes: RuntimeClass "
                            f"handler \"{RUNTIME_NAME}\"."))
    doc.add(tomlkit.comment("Merge into config.toml (or use --install); keep its runtimes.runc "
                            "table: the CRI plugin needs its default runtime."))
    doc.add("version", version)
    _set_runtime(doc, binary_name, version)
    return doc


def _set_runtime(doc: tomlkit.TOMLDocument, binary_name: str, version: int,
                 keep_default: bool = False) -> bool:
    """Put the torpor class into `doc`; True when something changed.

    A config file's runtimes table replaces containerd's built-in one, and the CRI plugin
    refuses to load when its default runtime is not in it; with `keep_default` the default
    runtime (runc, unless default_runtime_name says otherwise) is added when missing.
    """
    plugins = _child(doc, "plugins")
    cri = _child(plugins, CRI_PLUGIN[version])
    containerd = _child(cri, "containerd")
    runtimes = _child(containerd, "runtimes")
    changed = False
    default = str(containerd.get("default_runtime_name", "runc"))
    if keep_default and default not in runtimes and default != RUNTIME_NAME:
        table = tomlkit.table()
        table.add("runtime_type", "io.containerd.runc.v2")
        runtimes.add(default, table)
        changed = True
    current = runtimes.get(RUNTIME_NAME)
    if current is not None:
        options = current.get("options", {})
        if (current.get("runtime_type") == "io.containerd.runc.v2"
                and options.get("BinaryName") == binary_name):
            return changed
        extra = {k: v for k, v in options.items() if k != "BinaryName"}
        runtimes[RUNTIME_NAME] = runtime_table(binary_name, extra)
    else:
        runtimes.add(RUNTIME_NAME, runtime_table(binary_name))
    return True


def _child(parent: Any, key: str) -> Any:
    if key not in parent:
        table = tomlkit.table(is_super_table=True)
        parent.add(key, table)
    child = parent[key]
    if not isinstance(child, dict):
        raise ConfigError(f"config key {key!r} is not a table")
    return child


def render(binary_name: str, version: int = 2, decryption_keys: str | None = None) -> str:
    doc = document(binary_name, version)
    if decryption_keys:
        _set_decoder(doc, decoder_beside(binary_name), decryption_keys, version)
    return tomlkit.dumps(doc)


def config_version(doc: tomlkit.TOMLDocument) -> int:
    version = doc.get("version", 1)
    if version == 1:
        raise ConfigError(
            "this containerd config is version 1",
            hint="migrate it first: `containerd config migrate` (2.x) or add `version = 2`",
        )
    return int(version)


def install(path: str, binary_name: str, version: int | None = None,
            decryption_keys: str | None = None) -> tuple[bool, str | None]:
    """Merge the runtime class (and with `decryption_keys`, torpor-decoder) into config.toml at
    `path`; (changed, backup path)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from None
    if not text.strip():
        doc = document(binary_name, version or 2)
        _set_runtime(doc, binary_name, version or 2, keep_default=True)
        changed = True
    else:
        found = config_version(doc)
        if version is not None and version != found:
            raise ConfigError(f"{path} is config version {found}, not {version}")
        changed = _set_runtime(doc, binary_name, found, keep_default=True)
    if decryption_keys:
        changed = _set_decoder(doc, decoder_beside(binary_name), decryption_keys,
                               config_version(doc)) or changed
    if not changed:
        return False, None
    backup = None
    if text:
        backup = f"{path}.torpor-backup-{time.strftime('%Y%m%d%H%M%S')}"
        shutil.copy2(path, backup)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomic(path, tomlkit.dumps(doc).encode(), mode=0o644)
    return True, backup


def configured_binary(path: str) -> str | None:
    """The BinaryName of the runtime class torpor in containerd's config.toml at `path` (its
    CRI plugin's runtimes, config version 2 or 3); None where there is none (or no file)."""
    import tomllib

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return None
    version = int(doc.get("version", 1))
    plugin = (doc.get("plugins") or {}).get(CRI_PLUGIN.get(version, ""), {})
    runtime = ((plugin.get("containerd") or {}).get("runtimes") or {}).get(RUNTIME_NAME)
    if not isinstance(runtime, dict) or runtime.get("runtime_type") != "io.containerd.runc.v2":
        return None
    binary = (runtime.get("options") or {}).get("BinaryName")
    return str(binary) if binary else None
