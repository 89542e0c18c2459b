"""The GPU bench as far as a machine without a GPU can take it: the bundle package.sh makes
(CRIU through its bundled loader and libraries, torpor's source, pynvml), its dry run, and a
whole run with the fake driver and a host-memory workload through real CRIU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..gpu_fakes import H200, FakeLibs, FakeNode, gpu

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-bench") / "gpu-bench"
    subprocess.run(["bash", str(REPO / "bench" / "gpu" / "package.sh"), str(out)], check=True,
                   env=dict(os.environ, PYTHON=sys.executable), capture_output=True)
    return out


def run_bench(bundle: Path, *args: str, env: dict[str, str] | None = None,
              ) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "TORPOR_FAKE_GPU_DIR"}
    full.update(env or {}, PYTHON=sys.executable)
    return subprocess.run([str(bundle / "run.sh"), *args], capture_output=True, text=True,
                          env=full, timeout=300, cwd="/")


def test_the_bundle_carries_criu_with_its_libraries(bundle: Path) -> None:
    version = subprocess.run([str(bundle / "bin" / "criu"), "--version"], capture_output=True,
                             text=True, check=True, env={"PATH": "/nonexistent"}).stdout
    assert version.startswith("Version: 4.2")
    assert (bundle / "lib" / "libc.so.6").exists() and (bundle / "lib" / "libprotobuf-c.so.1").exists()
    assert (bundle / "python" / "pynvml.py").exists()
    assert (bundle / "python" / "torpor" / "gpu" / "cuda.py").exists()
    assert Path(f"{bundle}.tar.gz").stat().st_size > 1 << 20
    assert "Version: 4.2" in (bundle / "MANIFEST").read_text()


def test_dry_run_on_a_machine_without_gpu_says_what_is_missing(bundle: Path,
                                                               tmp_path: Path) -> None:
    result = run_bench(bundle, "--dry-run", "--images", str(tmp_path / "images"), "--gib", "1")
    assert result.returncode == 1
    assert result.stdout.rstrip().endswith("ready: no")
    report = json.loads(result.stdout[:result.stdout.rindex("ready:")])
    assert report["preflight"]["criu_check"] == "Looks good."
    assert any(p.startswith("no NVIDIA driver") for p in report["problems"])


def test_a_whole_run_with_the_fake_driver(bundle: Path, fake_libs: FakeLibs,
                                          tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "fake-gpu")
    node.configure([gpu(H200, 0)])
    out = tmp_path / "result.json"
    result = run_bench(
        bundle, "--device", "fake", "--gib", "0.05", "--cuda-library", str(fake_libs.cuda),
        "--nvml-library", str(fake_libs.nvml), "--images", str(tmp_path / "images"),
        "--work", str(tmp_path / "work"), "--keep", "--json", str(out), env=node.env())
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(out.read_text())["result"]
    assert found["verified_before"] and found["verified_after"]
    assert found["computing_after_restore"] and found["same_pid"]
    assert found["gpu_bytes"] == int(0.05 * (1 << 30)) // 4 * 4
    assert found["torpor_facts"]["managed_memory"] == 0
    assert "torpor's checks: restore thread" in result.stdout
    calls = [c for c in node.calls() if c.op in ("lock", "checkpoint", "restore", "unlock")]
    assert [(c.op, c.result) for c in calls] == [
        ("lock", 0), ("checkpoint", 0), ("restore", 0), ("unlock", 0)]
    images = tmp_path / "images"
    dump_end = (images / "dump.log").stat().st_mtime
    restore_end = (images / "restore.log").stat().st_mtime
    assert calls[1].realtime < min(p.stat().st_mtime for p in images.glob("pages-*.img"))
    assert dump_end < restore_end < calls[2].realtime
    assert "GB/s (CRIUgpu on H100: 0.7 GB/s)" in result.stdout
    assert 0 < found["answer_s"] < found["seconds"]["criu_restore"] + 30
    assert found["mode"] == "eager"


def test_a_lazy_restore_with_the_fake_driver(bundle: Path, fake_libs: FakeLibs,
                                             tmp_path: Path) -> None:
    """`--lazy`: criu lazy-pages serves the memory while the process runs; the driver's restore
    reads the host copy through userfaultfd, and the pattern is whole after it."""
    node = FakeNode(tmp_path / "fake-gpu")
    node.configure([gpu(H200, 0)])
    out = tmp_path / "result.json"
    result = run_bench(
        bundle, "--device", "fake", "--gib", "0.05", "--lazy", "--cuda-library",
        str(fake_libs.cuda), "--nvml-library", str(fake_libs.nvml), "--images",
        str(tmp_path / "images"), "--work", str(tmp_path / "work"), "--keep", "--json", str(out),
        env=node.env())
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(out.read_text())["result"]
    assert found["mode"] == "lazy" and found["verified_after"] and found["computing_after_restore"]
    assert found["seconds"]["complete"] >= found["seconds"]["criu_restore"]
    assert "restored lazy" in result.stdout
    lazy_log = (tmp_path / "images" / "lazy-pages.log").read_text()
    assert "UFFD" in lazy_log or "uffd" in lazy_log, lazy_log[-2000:]
