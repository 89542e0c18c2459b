"""Registries for the registry client's tests: real docker-registry processes on loopback.

Each test gets its own registry (starting one takes ~50 ms), so tests that tamper with storage
cannot disturb others; all are stopped by pid at the end of the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from torpor.registry import RegistryOptions

from ..support.checkpoint_layouts import WrittenLayout, write_checkpoint_layout
from ..support.registry import Registry
from ..support.token_server import TokenServer

USERS = {"alice": "wonderland"}

# Fast retries: the tests drop connections on purpose.
FAST = RegistryOptions(backoff_s=0.01, timeout_s=30)


@pytest.fixture
def start_registry(tmp_path: Path) -> Iterator[Callable[..., Registry]]:
    started: list[Registry] = []

    def start(name: str = "registry", **kwargs: object) -> Registry:
        registry = Registry(tmp_path / "registries", name, **kwargs).start()  # type: ignore[arg-type]
        started.append(registry)
        return registry

    yield start
    for registry in started:
        registry.stop()


@pytest.fixture
def plain_registry(start_registry: Callable[..., Registry]) -> Registry:
    return start_registry("plain")


@pytest.fixture
def basic_registry(start_registry: Callable[..., Registry]) -> Registry:
    return start_registry("basic", users=USERS)


@pytest.fixture
def tls_registry(start_registry: Callable[..., Registry]) -> Registry:
    return start_registry("tls", tls=True)


@pytest.fixture
def token_server(tmp_path: Path) -> Iterator[TokenServer]:
    directory = tmp_path / "token-server"
    directory.mkdir()
    server = TokenServer(directory, USERS).start()
    yield server
    server.stop()


@pytest.fixture
def token_registry(start_registry: Callable[..., Registry], token_server: TokenServer) -> Registry:
    return start_registry("token", token_auth=token_server.registry_settings())


@pytest.fixture
def layout(tmp_path: Path) -> WrittenLayout:
    return write_checkpoint_layout(tmp_path / "layout")


@pytest.fixture(autouse=True)
def no_docker_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the machine's own ~/.docker/config.json out of the tests."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
