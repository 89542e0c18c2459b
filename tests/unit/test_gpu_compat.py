"""Can a node take a checkpoint's GPU state? Tables of inventories and the words a user reads."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from torpor.errors import IncompatibleNode
from torpor.formats.fields import Fields
from torpor.formats.gpu import GpuInventory
from torpor.gpu import compat

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


def test_pairs_cover_every_recorded_gpu_even_one_without_processes() -> None:
    recorded = node(h200(0, A), h200(1, B),
                    processes=[{"pid": 1, "gpu_uuid": A, "used_memory": GIB}])
    assert compat.uuid_pairs(recorded, node(h200(0, C), h200(1, D))) == [(A, C), (B, D)]
    assert compat.mismatches(recorded, node(h200(0, C))) == []  # GPU 1 was not used


@pytest.mark.parametrize("here, expected", [
    (node(h200(0, A)),
     ["the checkpoint needs 2 GPU(s) (NVIDIA H200 (Hopper, compute capability 9.0), NVIDIA H200 "
      "(Hopper, compute capability 9.0)); this node has 1"]),
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
    (node(h200(0, A, persistence_mode=False), h200(1, B)),
     ["GPU 0 has persistence mode off: enable it (`nvidia-smi -i 0 -pm 1`, or run "
      "nvidia-persistenced)"]),
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
        ["the", "checkpoint", "needs"], ["this", "node", "has"], ["GPU", "0", "is"],
        ["GPU", "0", "has"], ["GPU", "0", "(GPU-c0000000-0000-0000-0000-000000000000)"],
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
