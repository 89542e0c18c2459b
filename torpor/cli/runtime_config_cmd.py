"""torpor runtime-config: the containerd runtime class and the drop-ins for other engines."""

from __future__ import annotations

import os
import shutil

import click

from torpor.errors import ConfigError
from torpor.runtime_config import containerd, engines


def _binary(path: str | None) -> str:
    found = path or shutil.which("torpor-runc")
    if not found:
        raise ConfigError("torpor-runc is not on PATH", hint="pass --binary /abs/path/torpor-runc")
    return os.path.abspath(found)


binary_option = click.option("--binary", metavar="PATH",
                             help="torpor-runc's absolute path (default: the one on PATH).")


@click.group("runtime-config")
def runtime_config() -> None:
    """Print or install the configuration that makes an engine use torpor."""


@runtime_config.command("containerd")
@binary_option
@click.option("--config-version", "version", type=click.Choice(["2", "3"]), default=None,
              help="containerd config version: 2 for 1.6/1.7, 3 for 2.x (default: 2, or the "
              "version of the file given to --install).")
@click.option("--install", "install_path", metavar="CONFIG_TOML",
              help="Merge into this config.toml, keeping its comments and settings (backup kept).")
@click.option("--decryption-keys", "keys_dir", metavar="DIR",
              help="Also decrypt encrypted images as they are pulled, with the private keys in "
              "DIR (containerd's own: /etc/containerd/ocicrypt/keys): torpor-decoder, beside "
              "torpor-runc, as containerd's stream processor of encrypted layers.")
def containerd_cmd(binary: str | None, version: str | None, install_path: str | None,
                   keys_dir: str | None) -> None:
    """The runtime class `torpor` (io.containerd.runc.v2 with BinaryName = torpor-runc)."""
    path = _binary(binary)
    if keys_dir and not os.path.isabs(keys_dir):
        raise ConfigError(f"--decryption-keys {keys_dir} is not an absolute path")
    if not install_path:
        click.echo(containerd.render(path, int(version or 2), keys_dir), nl=False)
        return
    changed, backup = containerd.install(install_path, path, int(version) if version else None,
                                         keys_dir)
    if not changed:
        click.echo(f"{install_path} already has the torpor runtime class"
                   + (" and torpor-decoder" if keys_dir else ""))
        return
    click.echo(f"added runtime class torpor{' and torpor-decoder' if keys_dir else ''} to "
               f"{install_path}" + (f" (backup: {backup})" if backup else ""))
    verifiers = containerd.image_verifiers(install_path) if keys_dir else []
    if verifiers:
        click.echo(f"warning: the CRI plugin now pulls images itself (use_local_image_pull), "
                   f"which containerd's image verifiers do not see: {', '.join(verifiers)} no "
                   "longer check what pods pull", err=True)
    click.echo("restart containerd to load it: systemctl restart containerd")


def _dropin(text: str, install_path: str | None, default: str) -> None:
    if install_path is None:
        click.echo(text, nl=False)
        return
    target = install_path or default
    changed = engines.install_dropin(target, text)
    click.echo(f"{'wrote' if changed else 'unchanged'}: {target}")


@runtime_config.command("podman")
@binary_option
@click.option("--install", "install_path", is_flag=False, flag_value="", default=None,
              metavar="PATH", help=f"Write the drop-in (default {engines.PODMAN_DROPIN}).")
def podman_cmd(binary: str | None, install_path: str | None) -> None:
    """containers.conf drop-in: podman --runtime torpor."""
    _dropin(engines.podman(_binary(binary)), install_path, engines.PODMAN_DROPIN)


@runtime_config.command("crio")
@binary_option
@click.option("--install", "install_path", is_flag=False, flag_value="", default=None,
              metavar="PATH", help=f"Write the drop-in (default {engines.CRIO_DROPIN}).")
def crio_cmd(binary: str | None, install_path: str | None) -> None:
    """crio.conf.d drop-in: the runtime handler torpor."""
    _dropin(engines.crio(_binary(binary)), install_path, engines.CRIO_DROPIN)


@runtime_config.command("kubernetes")
def kubernetes_cmd() -> None:
    """The RuntimeClass manifest (handler torpor), for kubectl apply -f -."""
    click.echo(engines.kubernetes_runtime_class(), nl=False)


COMMANDS = {"runtime-config": runtime_config}
