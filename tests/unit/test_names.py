"""Every name from a checkpoint or a user that becomes part of a host path is a containerd
identifier, checked in one place (torpor.formats.names)."""

from __future__ import annotations

import pytest

from torpor.errors import FormatError
from torpor.formats import names
from torpor.formats.fields import Fields
from torpor.formats.metadata import ContainerInfo
from torpor.formats.state import _container_id

GOOD = ["web", "a.b-c_d", "0" * 64, "x" * 76, "ctr-kv"]
BAD = ["", "x/../../../../etc", "..", ".", "a..b", "-a", "a-", "a/b", "/abs", "x" * 77,
       "a b", "web\n", "é", "a\x00b"]


@pytest.mark.parametrize("value", GOOD)
def test_identifiers_are_accepted(value: str) -> None:
    assert names.check_identifier(value, "the name") == value


@pytest.mark.parametrize("value", BAD)
def test_anything_that_could_leave_its_directory_is_refused_in_words(value: str) -> None:
    with pytest.raises(FormatError, match="is not a valid name"):
        names.check_identifier(value, "the container id")


@pytest.mark.parametrize("value", BAD[1:])
def test_checkpoint_documents_carry_no_path_as_their_container_id(value: str) -> None:
    record = {"id": value, "runtime": {"name": "io.containerd.runc.v2"}, "spec": {}}
    with pytest.raises(FormatError, match="is not a valid name"):
        ContainerInfo.from_json(Fields(record, "checkpoint.json: container"))
    with pytest.raises(FormatError, match="is not a valid name"):
        _container_id(Fields({"container_id": value}, "torpor-state.json"))
