"""Options every command that talks to a registry takes."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click

from torpor.ops.access import RegistryAccess

F = Callable[..., Any]


def registry_options(fn: F) -> F:
    for decorator in reversed([
        click.option("--username", "-u", envvar="TORPOR_REGISTRY_USERNAME",
                     help="Registry user (default: docker's config.json or credential helper)."),
        click.option("--password-stdin", is_flag=True, help="Read the registry password from stdin."),
        click.option("--ca-file", type=click.Path(exists=True, dir_okay=False),
                     help="PEM CA certificates for the registry's TLS."),
        click.option("--insecure", is_flag=True,
                     help="Allow plain HTTP and unverified TLS for this registry."),
    ]):
        fn = decorator(fn)
    return fn


def given(*options: str) -> list[str]:
    """Those of the registry `options` (parameter names) given on the command line (not from
    the environment), as the user spells them (--ca-file)."""
    ctx = click.get_current_context()
    return [f"--{name.replace('_', '-')}" for name in options
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE]


def access_from(username: str | None, password_stdin: bool, ca_file: str | None,
                insecure: bool) -> RegistryAccess:
    password = os.environ.get("TORPOR_REGISTRY_PASSWORD")
    if password_stdin and not username:
        raise click.UsageError("--password-stdin reads the password of --username USER: give "
                               "both (or neither: docker's config.json or credential helper)")
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    return RegistryAccess(username=username, password=password, ca_file=ca_file,
                          insecure=insecure)
