"""torpor runtime-config: what it prints parses, --install merges and keeps the user's file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from torpor.errors import ConfigError
from torpor.runtime_config import containerd, engines

REPO = Path(__file__).resolve().parents[2]
USER_CONFIG = """\
# my containerd, tuned by hand
version = 2
root = "/var/lib/containerd"  # on the big disk

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
"""


@pytest.mark.parametrize(("version", "plugin"), [(2, "io.containerd.grpc.v1.cri"),
                                                 (3, "io.containerd.cri.v1.runtime")])
def test_render_parses(version: int, plugin: str) -> None:
    doc = tomllib.loads(containerd.render("/usr/local/bin/torpor-runc", version))
    assert doc["version"] == version
    torpor = doc["plugins"][plugin]["containerd"]["runtimes"]["torpor"]
    assert torpor["runtime_type"] == "io.containerd.runc.v2"
    assert torpor["options"]["BinaryName"] == "/usr/local/bin/torpor-runc"


def test_install_keeps_comments_and_settings(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(USER_CONFIG)
    changed, backup = containerd.install(str(path), "/opt/torpor/bin/torpor-runc")
    assert changed and backup and Path(backup).read_text() == USER_CONFIG
    text = path.read_text()
    assert text.startswith(USER_CONFIG)  # every line of the user's file, in place
    doc = tomllib.loads(text)
    runtimes = doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True
    assert runtimes["torpor"]["options"]["BinaryName"] == "/opt/torpor/bin/torpor-runc"
    assert containerd.install(str(path), "/opt/torpor/bin/torpor-runc") == (False, None)
    assert path.read_text() == text


def test_install_updates_the_binary_and_keeps_other_options(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(USER_CONFIG)
    containerd.install(str(path), "/old/torpor-runc")
    text = path.read_text().replace('BinaryName = "/old/torpor-runc"',
                                    'BinaryName = "/old/torpor-runc"\nSystemdCgroup = true')
    path.write_text(text)
    changed, _ = containerd.install(str(path), "/new/torpor-runc")
    options = tomllib.loads(path.read_text())["plugins"]["io.containerd.grpc.v1.cri"][
        "containerd"]["runtimes"]["torpor"]["options"]
    assert changed and options == {"BinaryName": "/new/torpor-runc", "SystemdCgroup": True}


def test_install_into_a_minimal_config_keeps_cri_loadable(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('version = 2\nroot = "/x"\n')
    containerd.install(str(path), "/b/torpor-runc")
    runtimes = tomllib.loads(path.read_text())["plugins"]["io.containerd.grpc.v1.cri"][
        "containerd"]["runtimes"]
    assert set(runtimes) == {"runc", "torpor"}


def test_version_1_config_is_refused(tmp_path: Path) -> None:
    from torpor.errors import ConfigError

    path = tmp_path / "config.toml"
    path.write_text('root = "/x"\n')
    with pytest.raises(ConfigError, match="version 1"):
        containerd.install(str(path), "/b/torpor-runc")


def test_engine_dropins_parse() -> None:
    podman = tomllib.loads(engines.podman("/usr/local/bin/torpor-runc"))
    assert podman["engine"]["runtimes"]["torpor"] == ["/usr/local/bin/torpor-runc"]
    crio = tomllib.loads(engines.crio("/usr/local/bin/torpor-runc"))
    assert crio["crio"]["runtime"]["runtimes"]["torpor"]["runtime_path"] == \
        "/usr/local/bin/torpor-runc"
    assert "handler: torpor" in engines.kubernetes_runtime_class()


@pytest.mark.parametrize("version", [2, 3])
def test_install_names_torpor_decoder_for_encrypted_layers(tmp_path: Path, version: int) -> None:
    """--decryption-keys: torpor-decoder (beside torpor-runc) in the two stream processor tables
    containerd hands a layer's keys to; on 2.x the CRI plugin's own pull, which hands them."""
    path = tmp_path / "config.toml"
    path.write_text(USER_CONFIG.replace("version = 2", f"version = {version}")
                    .replace("io.containerd.grpc.v1.cri", containerd.CRI_PLUGIN[version]))
    keys = "/etc/containerd/ocicrypt/keys"
    changed, _ = containerd.install(str(path), "/opt/t/bin/torpor-runc", decryption_keys=keys)
    assert changed
    doc = tomllib.loads(path.read_text())
    tar, gzip = (doc["stream_processors"][f"io.containerd.ocicrypt.decoder.v1.{t}"]
                 for t in ("tar", "tar.gzip"))
    assert tar["path"] == gzip["path"] == "/opt/t/bin/torpor-decoder"
    assert "application/vnd.oci.image.layer.v1.tar+zstd+encrypted" in tar["accepts"]
    assert tar["returns"] == "application/vnd.oci.image.layer.v1.tar"
    assert tar["args"] == ["--decryption-keys-path", keys, "--decompress"]
    assert gzip["args"] == ["--decryption-keys-path", keys]
    local_pull = doc["plugins"].get("io.containerd.cri.v1.images", {}).get("use_local_image_pull")
    assert local_pull is (True if version == 3 else None)
    assert "SystemdCgroup = true" in path.read_text()       # the user's settings stay
    assert containerd.install(str(path), "/opt/t/bin/torpor-runc",
                              decryption_keys=keys) == (False, None)


def test_install_keeps_a_ctd_decoder_that_is_installed(tmp_path: Path) -> None:
    """imgcrypt's decoder on the node also opens pkcs7, pgp and key-provider images: torpor
    does not replace it behind the admin's back (a ctd-decoder named but not installed, as in
    containerd's defaults, is replaced)."""
    ctd = tmp_path / "ctd-decoder"
    ctd.write_text("#!/bin/sh\n")
    ctd.chmod(0o755)
    path = tmp_path / "config.toml"
    table = ('\n[stream_processors."io.containerd.ocicrypt.decoder.v1.tar"]\n'
             'accepts = ["application/vnd.oci.image.layer.v1.tar+encrypted"]\n'
             'returns = "application/vnd.oci.image.layer.v1.tar"\npath = "{}"\n')
    path.write_text(USER_CONFIG + table.format(ctd))
    with pytest.raises(ConfigError, match="ctd-decoder, installed on this node"):
        containerd.install(str(path), "/opt/t/bin/torpor-runc", decryption_keys="/k")
    path.write_text(USER_CONFIG + table.format("ctd-decoder-not-installed"))
    assert containerd.install(str(path), "/opt/t/bin/torpor-runc", decryption_keys="/k")[0]
