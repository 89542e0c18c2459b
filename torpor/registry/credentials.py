"""Registry credentials: explicit, or from docker's config.json and its credential helpers.

Lookup for a registry, the way `docker login` stores them:
  1. `credHelpers[<registry>]`: run `docker-credential-<helper> get`;
  2. `credsStore`: the same, with the default helper;
  3. `auths[<registry>]`: base64 `user:password` in `auth`, or `identitytoken`.
config.json is `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`. Docker Hub's entries
are keyed `https://index.docker.io/v1/`; other keys may carry a scheme or a path, which are
ignored. Secrets never appear in reprs, messages or logs.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torpor.errors import AuthError
from torpor.registry.reference import DOCKER_HUB_ALIASES

DOCKER_HUB_CONFIG_KEY = "https://index.docker.io/v1/"
HELPER_TIMEOUT_S = 30
IDENTITY_TOKEN_USER = "<token>"


@dataclass(frozen=True)
class Credentials:
    """A username and password, or an OAuth2 identity (refresh) token."""

    username: str = ""
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    source: str = ""  # where they came from, for messages: "--username", "config.json", a helper

    def basic_header(self) -> str:
        pair = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode()


def docker_config_path(env: Mapping[str, str] = os.environ) -> Path:
    directory = env.get("DOCKER_CONFIG") or str(Path(env.get("HOME", "~")).expanduser() / ".docker")
    return Path(directory) / "config.json"


def find_credentials(registry: str, config_path: Path | None = None,
                     env: Mapping[str, str] = os.environ) -> Credentials | None:
    """The credentials docker would use for `registry` (as written in the reference), or None."""
    path = config_path or docker_config_path(env)
    config = _read_config(path)
    if config is None:
        return None
    keys = _config_keys(registry)
    helpers = config.get("credHelpers")
    if isinstance(helpers, dict):
        for key in keys:
            helper = helpers.get(key)
            if isinstance(helper, str) and helper:
                return run_helper(helper, _server_url(registry), env)
    store = config.get("credsStore")
    if isinstance(store, str) and store:
        found = run_helper(store, _server_url(registry), env)
        if found is not None:
            return found
    auths = config.get("auths")
    if isinstance(auths, dict):
        for raw_key, entry in auths.items():
            if _normalise_key(str(raw_key)) in keys and isinstance(entry, dict):
                found = _from_auth_entry(entry, path)
                if found is not None:
                    return found
    return None


def run_helper(helper: str, server_url: str, env: Mapping[str, str] = os.environ) -> Credentials | None:
    """`docker-credential-<helper> get`; None when it has nothing for `server_url`."""
    program = f"docker-credential-{helper}"
    try:
        result = subprocess.run([program, "get"], input=server_url, capture_output=True, text=True,
                                timeout=HELPER_TIMEOUT_S, env=dict(env))
    except FileNotFoundError:
        raise AuthError(f"docker's config.json names the credential helper {helper!r}, "
                        f"but {program} is not on PATH",
                        hint="install it, or remove it from config.json") from None
    except subprocess.TimeoutExpired:
        raise AuthError(f"{program} did not answer within {HELPER_TIMEOUT_S}s") from None
    if result.returncode != 0:
        said = (result.stdout.strip() or result.stderr.strip()).splitlines()[:1]
        if said and "credentials not found" in said[0].lower():
            return None
        reason = said[0][:200] if said else f"exit status {result.returncode}"
        raise AuthError(f"{program} get failed for {server_url}: {reason}")
    try:
        answer = json.loads(result.stdout)
        username, secret = str(answer["Username"]), str(answer["Secret"])
    except (ValueError, KeyError, TypeError):
        raise AuthError(f"{program} get returned something other than "
                        "{\"Username\": ..., \"Secret\": ...}") from None
    if username == IDENTITY_TOKEN_USER:
        return Credentials(identity_token=secret, source=program)
    return Credentials(username, secret, source=program)


def _read_config(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise AuthError(f"cannot read docker config {path}: {e.strerror}") from None
    try:
        config = json.loads(text)
    except ValueError as e:
        raise AuthError(f"docker config {path} is not valid JSON: {e}") from None
    return config if isinstance(config, dict) else None


def _from_auth_entry(entry: dict[str, Any], path: Path) -> Credentials | None:
    source = str(path)
    token = entry.get("identitytoken")
    if isinstance(token, str) and token:
        return Credentials(username=str(entry.get("username", "")), identity_token=token, source=source)
    encoded = entry.get("auth")
    if isinstance(encoded, str) and encoded:
        try:
            username, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            sep = ""
        if not sep:
            raise AuthError(f"an 'auth' entry in {path} is not base64 of user:password",
                            hint="log in again with docker login")
        return Credentials(username, password, source=source)
    plain_user, plain_password = entry.get("username"), entry.get("password")
    if isinstance(plain_user, str) and isinstance(plain_password, str) and plain_user:
        return Credentials(plain_user, plain_password, source=source)
    return None


def _config_keys(registry: str) -> set[str]:
    if registry in DOCKER_HUB_ALIASES:
        return set(DOCKER_HUB_ALIASES) | {DOCKER_HUB_CONFIG_KEY}
    return {registry}


def _server_url(registry: str) -> str:
    return DOCKER_HUB_CONFIG_KEY if registry in DOCKER_HUB_ALIASES else registry


def _normalise_key(key: str) -> str:
    if key == DOCKER_HUB_CONFIG_KEY:
        return key
    for scheme in ("https://", "http://"):
        if key.startswith(scheme):
            key = key[len(scheme):]
    return key.split("/", 1)[0]
