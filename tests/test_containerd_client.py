"""torpor's containerd client against a real containerd: errors translated once, events, leases."""

from __future__ import annotations

import grpc
import pytest

from torpor.containerd.client import Client, translate
from torpor.errors import AlreadyExists, ContainerdError, NotFound

from .support.containerd import Node


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize("code", list(grpc.StatusCode))
def test_every_grpc_code_becomes_a_torpor_error(code: grpc.StatusCode) -> None:
    error = translate(FakeRpcError(code, "the details"), "doing it", "/run/x.sock")
    assert isinstance(error, ContainerdError)
    assert "doing it" in str(error) and "the details" in str(error)
    if code == grpc.StatusCode.NOT_FOUND:
        assert isinstance(error, NotFound)
    if code == grpc.StatusCode.ALREADY_EXISTS:
        assert isinstance(error, AlreadyExists)
    if code == grpc.StatusCode.UNAVAILABLE:
        assert "CONTAINERD_ADDRESS" in str(error)


def test_unreachable_containerd_is_explained(tmp_path: object) -> None:
    with Client(f"{tmp_path}/nothing.sock", "default") as client, \
            pytest.raises(ContainerdError, match="cannot reach containerd"):
        client.version()


@pytest.mark.real
def test_version_errors_and_leases(node: Node) -> None:
    with Client(node.address, node.namespace) as client:
        assert client.version().version.startswith(("1.6", "1.7", "v1.6", "v1.7", "2."))
        with pytest.raises(NotFound, match="container no-such-container"):
            client.get_container("no-such-container")
        with client.lease() as lease_id:
            assert lease_id.startswith("torpor-")
            assert ("containerd-lease", lease_id) in client.metadata()
        assert all(key != "containerd-lease" for key, _ in client.metadata())
