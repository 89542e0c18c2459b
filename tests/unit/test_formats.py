"""Every format torpor writes comes back equal, and a damaged or foreign file is refused in words."""

from __future__ import annotations

import json

import pytest

from torpor.errors import FormatError
from torpor.formats.fields import Fields
from torpor.formats.metadata import CheckpointMetadata
from torpor.formats.network import RestorePlan
from torpor.formats.request import CheckpointRequest
from torpor.formats.state import ContainerState

from .samples import METADATA, NETWORK, STATE


def roundtrip(document: object) -> object:
    return json.loads(json.dumps(document))


def test_checkpoint_metadata_round_trip() -> None:
    again = CheckpointMetadata.loads(METADATA.dumps(), "checkpoint.json")
    assert again == METADATA
    assert again.container.spec["unknown"] == {"kept": [1, 2]}  # the spec stays whole
    assert again.image is not None and again.image.manifest.platform == {
        "architecture": "amd64", "os": "linux"}


def test_container_state_round_trip() -> None:
    assert ContainerState.loads(STATE.dumps(), "state.json") == STATE


def test_request_round_trip_with_each_volume_policy() -> None:
    for volumes in ("all", "none", ("/a", "/b"), None):
        request = CheckpointRequest(volumes=volumes, dev_shm=False, rootfs=None,
                                    image_path="/x", expires=5.0)
        assert CheckpointRequest.loads(request.dumps(), "request") == request


def test_a_request_says_whether_the_images_are_kept_and_an_older_one_does_not() -> None:
    kept = CheckpointRequest(image_path="/x", keep_images=True)
    assert CheckpointRequest.loads(kept.dumps(), "request").keep_images is True
    older = {k: v for k, v in kept.to_json().items() if k != "keep_images"}
    assert CheckpointRequest.loads(json.dumps(older).encode(), "request").keep_images is False


def test_restore_plan_round_trip() -> None:
    plan = RestorePlan(("lo",), NETWORK.config.addresses, NETWORK.config.routes)
    assert RestorePlan.from_json(Fields(roundtrip(plan.to_json()), "plan")) == plan


@pytest.mark.parametrize("cls, document", [
    (CheckpointMetadata, METADATA.to_json()),
    (ContainerState, STATE.to_json()),
    (CheckpointRequest, CheckpointRequest().to_json()),
])
def test_unknown_versions_are_refused(cls: type, document: dict) -> None:  # type: ignore[type-arg]
    document = {**document, "format": "torpor.something.v9"}
    with pytest.raises(FormatError, match=r"has format 'torpor\.something\.v9'; this torpor reads"):
        cls.loads(json.dumps(document).encode(), "the file")


def test_a_wrong_field_is_named() -> None:
    document = METADATA.to_json()
    document["container"]["id"] = 42
    with pytest.raises(FormatError, match=r"checkpoint.json: container: id must be a string, "
                                          r"not the number 42"):
        CheckpointMetadata.loads(json.dumps(document).encode(), "checkpoint.json")
    document = STATE.to_json()
    document["network"]["sockets"][0]["port"] = "7000"
    with pytest.raises(FormatError, match=r"sockets\[0\]: port must be an integer"):
        ContainerState.loads(json.dumps(document).encode(), "state.json")


def test_missing_and_malformed_files_are_refused() -> None:
    with pytest.raises(FormatError, match="is not valid JSON"):
        CheckpointMetadata.loads(b"{not json", "checkpoint.json")
    with pytest.raises(FormatError, match="must be a JSON object, not a list"):
        CheckpointMetadata.loads(b"[]", "checkpoint.json")
    document = METADATA.to_json()
    del document["state"]
    with pytest.raises(FormatError, match="state is missing"):
        CheckpointMetadata.loads(json.dumps(document).encode(), "checkpoint.json")
