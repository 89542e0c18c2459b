"""Credentials (explicit, docker config.json, credential helpers), basic and bearer auth, and TLS,
against real docker-registry instances."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from torpor.errors import AuthError, RegistryError
from torpor.registry import RegistryOptions, pull, push_layout
from torpor.registry.session import RegistrySession

from ..support.checkpoint_layouts import WrittenLayout, write_single_blob_layout
from ..support.registry import Registry, credential_helper, docker_config
from ..support.token_server import TokenServer
from .conftest import FAST

pytestmark = pytest.mark.real


def with_login(username: str, password: str) -> RegistryOptions:
    return dataclasses.replace(FAST, username=username, password=password)


def test_basic_auth_from_docker_config(basic_registry: Registry, layout: WrittenLayout, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    config_dir = tmp_path / "docker"
    docker_config(config_dir, auths={f"https://{basic_registry.host}": ("alice", "wonderland")})
    monkeypatch.setenv("DOCKER_CONFIG", str(config_dir))
    ref = f"{basic_registry.host}/team/web1:ckpt-1"
    assert push_layout(layout.root, ref, options=FAST).uploaded == len(layout.blobs)
    assert pull(ref, tmp_path / "out", options=FAST).digest == layout.top["digest"]


def test_basic_auth_from_a_credential_helper(basic_registry: Registry, layout: WrittenLayout,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_dir = tmp_path / "docker"
    docker_config(config_dir, cred_helpers={basic_registry.host: "torpor-test"})
    credential_helper(tmp_path / "bin", "torpor-test", {basic_registry.host: ("alice", "wonderland")})
    monkeypatch.setenv("DOCKER_CONFIG", str(config_dir))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{Path('/usr/bin')}:{Path('/bin')}")
    ref = f"{basic_registry.host}/team/web1:ckpt-1"
    assert push_layout(layout.root, ref, options=FAST).digest == layout.top["digest"]


def test_creds_store_without_an_entry_means_anonymous(basic_registry: Registry, layout: WrittenLayout,
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    config_dir = tmp_path / "docker"
    docker_config(config_dir, creds_store="torpor-test")
    credential_helper(tmp_path / "bin", "torpor-test", {"elsewhere.example:5000": ("bob", "x")})
    monkeypatch.setenv("DOCKER_CONFIG", str(config_dir))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    with pytest.raises(AuthError, match="requires a login") as raised:
        push_layout(layout.root, f"{basic_registry.host}/team/web1:ckpt-1", options=FAST)
    assert "docker login" in str(raised.value)


def test_wrong_password_is_an_auth_error(basic_registry: Registry, layout: WrittenLayout) -> None:
    with pytest.raises(AuthError) as raised:
        push_layout(layout.root, f"{basic_registry.host}/team/web1:ckpt-1",
                    options=with_login("alice", "not-the-password"))
    message = str(raised.value)
    assert "rejected the credentials of user 'alice'" in message and "docker login" in message
    assert "not-the-password" not in message


def test_explicit_login_overrides_docker_config(basic_registry: Registry, layout: WrittenLayout,
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_dir = tmp_path / "docker"
    docker_config(config_dir, auths={basic_registry.host: ("alice", "stale")})
    monkeypatch.setenv("DOCKER_CONFIG", str(config_dir))
    ref = f"{basic_registry.host}/team/web1:ckpt-1"
    with pytest.raises(AuthError, match=r"from .*config\.json"):
        push_layout(layout.root, ref, options=FAST)
    assert push_layout(layout.root, ref, options=with_login("alice", "wonderland")).uploaded


def test_bearer_tokens_are_fetched_once_per_scope(token_registry: Registry, token_server: TokenServer,
                                                  layout: WrittenLayout, tmp_path: Path) -> None:
    ref = f"{token_registry.host}/team/web1:ckpt-1"
    login = with_login("alice", "wonderland")
    pushed = push_layout(layout.root, ref, options=login)
    assert pushed.uploaded == len(layout.blobs)
    push_requests = [scopes for user, scopes in token_server.requests if user == "alice"]
    assert push_requests == [["repository:team/web1:pull,push"]], "one token serves the whole push"
    token_server.requests.clear()
    pull(ref, tmp_path / "out", options=login)
    assert [s for _, s in token_server.requests] == [["repository:team/web1:pull"]]


def test_bearer_wrong_password_and_anonymous(token_registry: Registry, token_server: TokenServer,
                                             layout: WrittenLayout, tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="rejected the credentials of user 'alice'"):
        push_layout(layout.root, f"{token_registry.host}/team/web1:1", options=with_login("alice", "nope"))
    with pytest.raises(AuthError, match="answered 401"):
        push_layout(layout.root, f"{token_registry.host}/team/web1:1", options=FAST)
    push_layout(layout.root, f"{token_registry.host}/public/web1:1",
                options=with_login("alice", "wonderland"))
    token_server.requests.clear()
    assert pull(f"{token_registry.host}/public/web1:1", tmp_path / "anon", options=FAST).digest
    assert {user for user, _ in token_server.requests} == {None}, "anonymous token fallback"


def test_bearer_token_refreshed_once_after_a_401(token_registry: Registry, token_server: TokenServer,
                                                 layout: WrittenLayout) -> None:
    ref = f"{token_registry.host}/team/web1:ckpt-1"
    login = with_login("alice", "wonderland")
    push_layout(layout.root, ref, options=login)
    from torpor.registry.client import RepositoryClient
    from torpor.registry.reference import parse_reference

    session = RegistrySession.for_reference(parse_reference(ref), login)
    repo = RepositoryClient(session, "team/web1")
    assert repo.blob_exists(str(layout.top["digest"])) is False  # a manifest is not a blob
    scope = repo.pull_scope
    session.auth._tokens[scope] = ("expired-or-revoked", float("inf"))
    token_server.requests.clear()
    assert repo.get_manifest("ckpt-1", 1 << 22).digest == layout.top["digest"]
    assert len(token_server.requests) == 1
    session.close()


def test_tls_with_the_ca_file(tls_registry: Registry, layout: WrittenLayout, tmp_path: Path) -> None:
    ref = f"{tls_registry.host}/team/web1:ckpt-1"
    with_ca = dataclasses.replace(FAST, ca_file=tls_registry.ca_file)
    assert push_layout(layout.root, ref, options=with_ca).uploaded == len(layout.blobs)
    assert pull(ref, tmp_path / "out", options=with_ca).digest == layout.top["digest"]
    assert pull(ref, tmp_path / "insecure", options=dataclasses.replace(FAST, insecure=True)).digest


def test_tls_without_the_ca_is_a_clear_error(tls_registry: Registry, layout: WrittenLayout,
                                             tmp_path: Path) -> None:
    with pytest.raises(RegistryError) as raised:
        pull(f"{tls_registry.host}/team/web1:ckpt-1", tmp_path / "out", options=FAST)
    message = str(raised.value)
    assert "TLS certificate" in message and "could not be verified" in message and "--ca-file" in message
    assert not (tmp_path / "out").exists()


def test_nothing_listening_is_a_clear_error(tmp_path: Path) -> None:
    from ..support.processes import free_port

    with pytest.raises(RegistryError, match="connection refused"):
        pull(f"127.0.0.1:{free_port()}/team/web1:1", tmp_path / "out", options=FAST)


def test_token_rejected_in_the_middle_of_an_upload(token_registry: Registry, token_server: TokenServer,
                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry refuses the token of a PATCH (as when it expires mid-push): the chunk is sent
    again, from its start, with a fresh token, and the blob arrives intact."""
    layout = write_single_blob_layout(tmp_path / "big", 3 << 20)
    original = RegistrySession.send_file
    poisoned: list[str] = []

    def send_file(self: RegistrySession, method: str, url: str, **kwargs: Any) -> Any:
        if method == "PATCH" and not poisoned:
            poisoned.append(kwargs["scope"])
            self.auth._tokens[kwargs["scope"]] = ("revoked", float("inf"))
        return original(self, method, url, **kwargs)

    monkeypatch.setattr(RegistrySession, "send_file", send_file)
    ref = f"{token_registry.host}/team/big:1"
    login = dataclasses.replace(with_login("alice", "wonderland"), chunk_size=1 << 20)
    push_layout(layout.root, ref, options=login)
    assert poisoned
    pulled = pull(ref, tmp_path / "out", options=login)
    assert pulled.bytes_downloaded == (3 << 20) + 2  # the layer and the empty config


def test_a_401_from_where_the_registry_redirected_gets_no_credentials(
        start_registry: Any, token_server: TokenServer, layout: WrittenLayout,
        tmp_path: Path) -> None:
    """Blobs redirected to a CDN that then answers 401 naming a token realm on a third host:
    that realm is not the registry's, and the registry's credentials never go there (nor to the
    CDN); the pull fails in words naming the host that answered."""
    from ..support.blob_cdn import BlobCdn

    cdn, elsewhere = BlobCdn(), BlobCdn()
    try:
        registry = start_registry("redirecting", token_auth=token_server.registry_settings(),
                                  redirect_blobs=cdn.url)
        cdn.storage = registry.storage
        ref = f"{registry.host}/team/web1:ckpt-1"
        login = with_login("alice", "wonderland")
        push_layout(layout.root, ref, options=login)
        assert pull(ref, tmp_path / "through-the-cdn", options=login).digest  # a good CDN
        assert any("/docker/registry/v2/blobs/" in s.path for s in cdn.seen)
        cdn.challenge = f'Bearer realm="{elsewhere.url}/token",service="cdn",scope="x:y:pull"'
        with pytest.raises(AuthError, match=f"{cdn.url.split('//')[1]}, where registry .* answered 401"):
            pull(ref, tmp_path / "challenged", options=login)
        assert elsewhere.seen == [], "nothing at all goes to a realm the registry did not name"
        assert cdn.authorizations() == []
        # the registry's own realm still serves it afterwards
        cdn.challenge = None
        assert pull(ref, tmp_path / "again", options=login).digest
    finally:
        cdn.stop()
        elsewhere.stop()
