"""The NVML inventory (nvidia-ml-py over the fake libnvidia-ml) and what `torpor check` says."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from torpor import config
from torpor.errors import GpuError
from torpor.formats.fields import Fields
from torpor.formats.flat import to_flat
from torpor.formats.gpu import GpuInventory
from torpor.gpu import cuda, inventory
from torpor.ops import check

from ..gpu_fakes import A100, DRIVER_570, H200, FakeLibs, FakeNode, gpu
from .conftest import Worker

GIB = 1 << 30


def gather(libs: FakeLibs, pids: tuple[int, ...] = ()) -> GpuInventory:
    return inventory.gather(str(libs.nvml), str(libs.cuda), pids)


def test_inventory_of_the_node_and_the_containers_processes(
        fake_libs: FakeLibs, fake_node: FakeNode, cuda_process: Worker,
        driver: cuda.CudaDriver) -> None:
    fake_node.configure([gpu(H200, 0, memory_used=2 * GIB), gpu(A100, 1, mig=-1, persistence=0)])
    ours = cuda_process("inv-ours", gpu_index=0, memory=5 * GIB)
    other = cuda_process("inv-other", gpu_index=1, memory=3 * GIB)
    inv = gather(fake_libs, (ours.pid,))
    assert GpuInventory.from_json(Fields(json.loads(json.dumps(inv.to_json())), "x")) == inv
    assert (inv.driver_version, inv.cuda_driver_version, inv.checkpoint_api) == (
        "580.65.06", 13000, True)
    h200, a100 = inv.gpus
    assert to_flat(h200) == {
        "index": 0, "uuid": fake_node.gpus[0]["uuid"], "name": "NVIDIA H200",
        "architecture": "Hopper", "compute_capability": "9.0",
        "memory_total": H200["memory_total"], "memory_used": 7 * GIB,
        "memory_free": H200["memory_total"] - 7 * GIB, "pci_bus_id": "00000000:19:00.0",
        "minor_number": 0, "mig_mode": "off", "persistence_mode": True}
    assert (a100.architecture, a100.compute_capability, a100.mig_mode,
            a100.persistence_mode, a100.memory_used) == ("Ampere", "8.0", "unsupported",
                                                         False, 3 * GIB)
    assert [to_flat(p) for p in inv.processes] == [{"pid": ours.pid, "gpu_uuid": h200.uuid,
                                                    "used_memory": 5 * GIB}]
    assert other.pid not in [p.pid for p in inv.processes]
    driver.lock(ours.pid, 1000)
    driver.checkpoint(ours.pid)  # a checkpointed process has given its GPU memory back
    after = gather(fake_libs, (ours.pid,))
    assert after.processes == ()
    assert after.gpus[0].memory_used == 2 * GIB
    driver.restore(ours.pid)
    driver.unlock(ours.pid)


def test_describe_names_driver_gpus_and_processes(fake_libs: FakeLibs, fake_node: FakeNode,
                                                  cuda_process: Worker) -> None:
    proc = cuda_process("inv-describe", memory=4 * GIB)
    lines = inventory.describe(gather(fake_libs, (proc.pid,)))
    assert lines[0] == "NVIDIA driver 580.65.06, CUDA 13.0"
    assert lines[1].startswith("GPU 0: NVIDIA H200 (Hopper, compute capability 9.0), 140.4 GiB")
    assert lines[-1] == f"pid {proc.pid}: 4.0 GiB on {fake_node.gpus[0]['uuid']}"


def test_no_driver_is_none_and_gather_says_so(fake_libs: FakeLibs, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    missing = str(tmp_path / "libnvidia-ml.so.1")
    assert inventory.gather_or_none(missing, str(fake_libs.cuda)) is None
    monkeypatch.delenv("TORPOR_FAKE_GPU_DIR", raising=False)  # library there, driver not loaded
    assert inventory.gather_or_none(str(fake_libs.nvml), str(fake_libs.cuda)) is None
    with pytest.raises(GpuError, match="no NVIDIA driver"):
        inventory.gather(missing, str(fake_libs.cuda))


def test_nvml_errors_become_gpu_errors(fake_libs: FakeLibs, fake_node: FakeNode) -> None:
    fake_node.configure([gpu(H200, 0, lost=1)])
    with pytest.raises(GpuError, match="NVML could not read the memory of GPU 0: GPU is lost"):
        gather(fake_libs)


def test_the_configured_library_is_the_one_used(fake_libs: FakeLibs, fake_node: FakeNode,
                                                tmp_path: Path) -> None:
    """pynvml keeps one library per process: switching paths must really switch."""
    assert gather(fake_libs).driver_version == "580.65.06"
    copy = tmp_path / "other" / "libnvidia-ml.so.1"
    copy.parent.mkdir()
    shutil.copy(fake_libs.nvml, copy)
    assert inventory.gather_or_none(str(copy), str(fake_libs.cuda)) is not None
    import pynvml

    assert pynvml.nvmlLib._name == str(copy)
    assert inventory.gather_or_none(str(tmp_path / "none.so"), str(fake_libs.cuda)) is None
    assert gather(fake_libs).gpus
    assert pynvml.nvmlLib._name == str(fake_libs.nvml)


def torpor_config(tmp_path: Path, libs: FakeLibs) -> config.Config:
    return config.Config({"gpu": {"cuda_library": str(libs.cuda),
                                  "nvml_library": str(libs.nvml)}}, str(tmp_path / "t.toml"))


def report(tmp_path: Path, libs: FakeLibs) -> dict[str, tuple[str, str]]:
    return {r.name: (r.status, r.detail) for r in check.check_gpu(torpor_config(tmp_path, libs))}


def test_torpor_check_reports_a_ready_gpu_node(fake_libs: FakeLibs, fake_node: FakeNode,
                                               tmp_path: Path) -> None:
    seen = report(tmp_path, fake_libs)
    assert seen == {
        "gpus": ("ok", "2 x NVIDIA H200"),
        "gpu driver": ("ok", "580.65.06 (CUDA 13.0)"),
        "gpu persistence mode": ("ok", "on"),
        "gpu MIG": ("ok", "off"),
        "criu cuda plugin": ("ok", "not installed (torpor drives the driver)"),
    }


def test_torpor_check_names_what_to_fix(fake_libs: FakeLibs, fake_node: FakeNode,
                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_node.configure([gpu(H200, 0, persistence=0), gpu(H200, 1, mig=1)], DRIVER_570)
    seen = report(tmp_path, fake_libs)
    assert seen["gpu driver"] == (
        "warn", "570.86.10: restores only onto the same GPUs (other GPUs need driver 580 or "
        "newer) and a container given only some of this node's GPUs cannot be checkpointed or "
        "restored ('operation not permitted', fixed in 575.57.08)")
    assert seen["gpu persistence mode"] == (
        "warn", "off on GPU 0: torpor calls cuInit before each GPU restore instead; "
        "`nvidia-smi -pm 1` (or nvidia-persistenced) keeps the driver loaded between calls")
    assert seen["gpu MIG"][0] == "fail" and "GPU 1" in seen["gpu MIG"][1]
    fake_node.configure([gpu(H200, 0)], ("575.57.08", 12090))
    assert report(tmp_path, fake_libs)["gpu driver"] == (
        "warn", "575.57.08: restores only onto the same GPUs (other GPUs need driver 580 or newer)")
    fake_node.configure([gpu(H200, 0)], ("560.35.03", 12060))
    assert report(tmp_path, fake_libs)["gpu driver"] == (
        "fail", "560.35.03: the CUDA checkpoint API needs driver 570 or newer")
    monkeypatch.delenv("TORPOR_FAKE_GPU_DIR")
    assert report(tmp_path, fake_libs) == {
        "gpu driver": ("skip", "no NVIDIA driver loaded (GPU checkpoint off)")}


def test_criu_cuda_plugin_is_found_where_criu_would_load_it(tmp_path: Path) -> None:
    from torpor.gpu import criu_plugin

    default, configured = tmp_path / "default", tmp_path / "configured"
    for directory in (default, configured):
        directory.mkdir()
    conf = tmp_path / "runc.conf"
    conf.write_text("# torpor test\ntcp-established\nlibdir " + str(configured) + "\n")
    env = {"CRIU_LIBS_DIR": str(default)}
    assert criu_plugin.installed_cuda_plugin(env, (str(conf),)) is None
    (default / "cuda_plugin.so").touch()
    assert criu_plugin.installed_cuda_plugin(env, ()) == str(default / "cuda_plugin.so")
    (configured / "cuda_plugin.so").touch()
    assert criu_plugin.installed_cuda_plugin(env, (str(conf),)) == str(
        configured / "cuda_plugin.so")
    assert criu_plugin.plugin_dirs({}, ()) == ["/usr/lib/criu"]
