"""Can a node take a checkpoint's GPU state? Tables of inventories and the words a user reads."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from torpor.errors import FormatError, IncompatibleNode
from torpor.formats.fields import Fields
from torpor.formats.gpu import CudaProcess, GpuInventory, GpuState
from torpor.gpu import compat, visibility
from torpor.gpu.visibility import ContainerGpus

GIB = 1 << 30
A, B, C, D = (f"GPU-{n}0000000-0000-0000-0000-000000000000" for n in "abcd")


def h200(index: int, uuid: str, free: int = 140 * GIB, **extra: Any) -> dict[str, Any]:
    return {"index": index, "uuid": uuid, "name": "NVIDIA H200", "architecture": "Hopper",
            "compute_capability": "9.0", "memory_total": 140 * GIB, "memory_used": 0,
            "memory_free": free, "pci_bus_id": f"00000000:{index + 0x19:02X}:00.0",
            "minor_number": index, "mig_mode": "off", "persistence_mode": True, **extra}


def node(*gpus: dict[str, Any], driver: str = "580.65.06", cuda: int = 13000,
         processes: list[dict[str, Any]] | None = None) -> GpuInventory:
    return GpuInventory.from_json(Fields(
        {"driver_version": driver, "cuda_driver_version": cuda, "checkpoint_api": True,
         "gpus": list(gpus), "processes": processes or []}, "inventory"))


RECORDED = node(h200(0, A), h200(1, B), processes=[
    {"pid": 10, "gpu_uuid": A, "used_memory": 30 * GIB},
    {"pid": 11, "gpu_uuid": A, "used_memory": 10 * GIB},
    {"pid": 12, "gpu_uuid": B, "used_memory": 20 * GIB}])


def test_the_same_node_fits_and_needs_no_pairs() -> None:
    here = node(h200(0, A), h200(1, B))
    assert compat.mismatches(RECORDED, here) == []
    assert compat.uuid_pairs(RECORDED, here) is None


def test_same_gpus_in_another_order_are_still_identity() -> None:
    assert compat.uuid_pairs(RECORDED, node(h200(0, B), h200(1, A))) is None


def test_other_gpus_of_the_same_model_get_pairs_by_index() -> None:
    here = node(h200(0, C), h200(1, D))
    assert compat.mismatches(RECORDED, here) == []
    assert compat.uuid_pairs(RECORDED, here) == [(A, C), (B, D)]


def test_pairs_cover_every_gpu_the_container_could_see_even_one_without_memory() -> None:
    """The driver checkpoints every GPU a process sees; pairs "must contain every checkpointed
    GPU": a GPU seen but never allocated on counts as much as one holding memory."""
    recorded = node(h200(0, A), h200(1, B),
                    processes=[{"pid": 1, "gpu_uuid": A, "used_memory": GIB}])
    assert compat.uuid_pairs(recorded, node(h200(0, C), h200(1, D)), (A, B)) == [(A, C), (B, D)]
    assert compat.mismatches(recorded, node(h200(0, C)), (A, B)) == [
        "the checkpoint's processes could see 2 GPU(s) (NVIDIA H200 (Hopper, compute capability "
        "9.0), NVIDIA H200 (Hopper, compute capability 9.0)) and each must be restored onto "
        "one; this node has 1"]
    with pytest.raises(IncompatibleNode, match="could see 2 GPU"):
        compat.uuid_pairs(recorded, node(h200(0, C)), (A, B))
    # a container that saw only GPU A: one GPU is enough, whatever its index was
    only_b = node(h200(0, A), h200(1, B), processes=[{"pid": 1, "gpu_uuid": B, "used_memory": 1}])
    assert compat.mismatches(only_b, node(h200(0, C)), (B,)) == []
    assert compat.uuid_pairs(only_b, node(h200(0, C)), (B,)) == [(B, C)]


def container(*gpus: dict[str, Any], unknown: tuple[str, ...] = ()) -> ContainerGpus:
    return ContainerGpus(tuple(node(*gpus).gpus), "the devices in the container's spec",
                         unknown)


def test_the_restored_container_is_given_gpus_of_its_own() -> None:
    """Each GPU maps onto one given to the new container, not onto any GPU of the node."""
    recorded = node(h200(0, A), h200(1, B), processes=[{"pid": 1, "gpu_uuid": A, "used_memory": 1}])
    here = node(h200(0, A), h200(1, B), h200(2, C))
    assert compat.uuid_pairs(recorded, here, (A,), container(h200(0, A))) is None
    assert compat.uuid_pairs(recorded, here, (A,), container(h200(2, C))) == [(A, C)]
    assert compat.mismatches(recorded, here, (A, B), container(h200(2, C))) == [
        "the checkpoint's processes could see 2 GPU(s) (NVIDIA H200 (Hopper, compute capability "
        "9.0), NVIDIA H200 (Hopper, compute capability 9.0)) and each must be restored onto "
        "one; this container is given 1 (the devices in the container's spec)"]
    assert compat.mismatches(recorded, here, (A,), container(h200(0, A), unknown=(
        "/dev/nvidia7",))) == ["the container is given /dev/nvidia7 (the devices in the "
                               "container's spec), which is no GPU of this node"]


def test_driver_570_cannot_restore_a_container_given_only_some_gpus() -> None:
    recorded = node(h200(0, A), h200(1, B), driver="570.86.10", cuda=12080,
                    processes=[{"pid": 1, "gpu_uuid": A, "used_memory": 1}])
    here = node(h200(0, A), h200(1, B), driver="570.86.10", cuda=12080)
    found = compat.mismatches(recorded, here, (A,), container(h200(0, A)))
    assert found == [
        "this container is given 1 of this node's 2 GPUs (the devices in the container's spec), "
        "and NVIDIA driver 570.86.10 cannot restore a container given only some GPUs "
        "(\"operation not permitted\"; fixed in 575.57.08): upgrade the driver, or give the "
        "container every GPU"]
    fixed = dataclasses.replace(here, driver_version="575.57.08")
    assert compat.mismatches(dataclasses.replace(recorded, driver_version="575.57.08"), fixed,
                             (A,), container(h200(0, A))) == []


def test_persistence_mode_off_is_no_refusal() -> None:
    """torpor calls cuInit before restoring, which the reference accepts instead."""
    assert compat.mismatches(RECORDED, node(h200(0, A, persistence_mode=False), h200(1, B))) == []


@pytest.mark.parametrize("here, expected", [
    (node(h200(0, A)),
     ["the checkpoint's processes could see 2 GPU(s) (NVIDIA H200 (Hopper, compute capability "
      "9.0), NVIDIA H200 (Hopper, compute capability 9.0)) and each must be restored onto one; "
      "this node has 1"]),
    (node(h200(0, C), h200(1, D, name="NVIDIA H100 80GB HBM3")),
     ["GPU 1 is a NVIDIA H100 80GB HBM3 (Hopper, compute capability 9.0); the checkpoint needs "
      "a NVIDIA H200 (Hopper, compute capability 9.0)"]),
    (node(h200(0, C, name="NVIDIA A100-SXM4-80GB", architecture="Ampere",
               compute_capability="8.0"), h200(1, D)),
     ["GPU 0 is a NVIDIA A100-SXM4-80GB (Ampere, compute capability 8.0); the checkpoint needs "
      "a NVIDIA H200 (Hopper, compute capability 9.0)"]),
    (node(h200(0, A), h200(1, B), driver="580.95.05"),
     ["this node has NVIDIA driver 580.95.05; the checkpoint was taken with 580.65.06: install "
      "the same driver version"]),
    (node(h200(0, A, free=39 * GIB), h200(1, B)),
     [f"GPU 0 ({A}) has 39.0 GiB free; the checkpointed processes need 40.0 GiB on it: free GPU "
      "memory (stop other work on it) or restore on another node"]),
    (node(h200(0, A), h200(1, B, mig_mode="on")),
     ["GPU 1 has MIG enabled, which CUDA checkpoints do not support: disable it (`nvidia-smi -i "
      "1 -mig 0`)"]),
    (None,
     ["the checkpoint holds GPU state, but this node has no NVIDIA driver (NVML cannot be "
      "loaded): restore on a node with NVIDIA GPUs"]),
])
def test_each_mismatch_is_named(here: GpuInventory | None, expected: list[str]) -> None:
    assert compat.mismatches(RECORDED, here) == expected


def test_every_mismatch_is_listed_at_once() -> None:
    here = node(h200(0, C, persistence_mode=False, free=GIB, name="NVIDIA H100"),
                driver="570.86.10", cuda=12080)
    found = compat.mismatches(RECORDED, here)
    assert [m.split(" ", 3)[:3] for m in found] == [
        ["the", "checkpoint's", "processes"], ["this", "node", "has"], ["GPU", "0", "is"],
        ["GPU", "0", "(GPU-c0000000-0000-0000-0000-000000000000)"],
        ["the", "checkpoint's", "GPUs"]]
    assert found[-1] == (f"the checkpoint's GPUs {A}, {B} are not on this node, and restoring "
                         "onto other GPUs needs driver 580 (CUDA 13.0) or newer; this node has "
                         "570.86.10 (CUDA 12.8)")


def test_driver_570_restores_only_onto_the_same_gpus() -> None:
    recorded = dataclasses.replace(RECORDED, driver_version="570.86.10", cuda_driver_version=12080)
    same = node(h200(0, A), h200(1, B), driver="570.86.10", cuda=12080)
    assert compat.mismatches(recorded, same) == []
    assert compat.uuid_pairs(recorded, same) is None
    other = node(h200(0, C), h200(1, D), driver="570.86.10", cuda=12080)
    with pytest.raises(IncompatibleNode, match="needs driver 580"):
        compat.uuid_pairs(recorded, other)


def test_nothing_recorded_means_nothing_to_compare() -> None:
    assert compat.mismatches(None, node(h200(0, A))) == []
    assert compat.uuid_pairs(None, node(h200(0, A))) is None


def test_needed_memory_and_shortfalls() -> None:
    assert compat.needed_memory(RECORDED) == {A: 40 * GIB, B: 20 * GIB}
    assert compat.memory_shortfalls(RECORDED, node(h200(0, C), h200(1, D, free=19 * GIB))) == [
        f"GPU 1 ({D}) has 19.0 GiB free; the checkpointed processes need 20.0 GiB on it: free "
        "GPU memory (stop other work on it) or restore on another node"]


def test_the_gpus_a_container_sees_come_from_its_spec() -> None:
    gpus = node(h200(0, A), h200(1, B), h200(2, C)).gpus
    spec: dict[str, Any] = {"linux": {"devices": [
        {"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]}}
    seen = visibility.container_gpus(gpus, spec)
    assert ([g.uuid for g in seen.gpus], seen.partial) == ([C], True)
    assert seen.source == "the devices in the container's spec"
    mounts = {"mounts": [{"destination": "/dev/nvidia1", "source": "/nonexistent/nvidia1"},
                         {"destination": "/dev/nvidia9", "source": "/nonexistent/nvidia9"}]}
    seen = visibility.container_gpus(gpus, mounts)
    assert [g.uuid for g in seen.gpus] == [B] and seen.unknown == ("/dev/nvidia9",)
    env = {"process": {"env": ["PATH=/bin", f"NVIDIA_VISIBLE_DEVICES=0,{C}"]}}
    assert [g.uuid for g in visibility.container_gpus(gpus, env).gpus] == [A, C]
    for every in ({}, {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}):
        seen = visibility.container_gpus(gpus, every)
        assert ([g.uuid for g in seen.gpus], seen.partial) == ([A, B, C], False)


def test_gpu_state_round_trips_and_refuses_damage() -> None:
    state = GpuState(13000, (CudaProcess(10, 1),), RECORDED, visible_gpus=(A, B),
                     stopped_ns_pids=(7,))
    data = json.loads(json.dumps(state.to_json()))
    assert GpuState.from_json(Fields(data, "state.json: gpu")) == state
    for key, bad, words in (("visible_gpus", ["nvidia0"], "visible_gpus[0] is not a GPU UUID"),
                            ("visible_gpus", "GPU-x", "visible_gpus must be a list"),
                            ("stopped_ns_pids", [True], "stopped_ns_pids must be a list of pids"),
                            ("stopped_ns_pids", [0], "stopped_ns_pids must be a list of pids")):
        with pytest.raises(FormatError, match=re.escape(words)):
            GpuState.from_json(Fields(dict(data, **{key: bad}), "state.json: gpu"))
    old = {k: v for k, v in data.items() if k not in ("visible_gpus", "stopped_ns_pids")}
    assert GpuState.from_json(Fields(old, "state.json: gpu")).visible_gpus == ()
