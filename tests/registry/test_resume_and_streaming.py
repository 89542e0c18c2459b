"""Uploads survive a dropped connection, and large blobs stream through a bounded amount of memory."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from torpor import nice
from torpor.formats.oci import Descriptor
from torpor.registry import EarlyBlobs, PushResult, RegistryOptions, pull, push_layout

from ..support.checkpoint_layouts import WrittenLayout, write_single_blob_layout
from ..support.registry import Registry
from ..support.tcp_proxy import DroppingProxy
from .conftest import FAST

pytestmark = pytest.mark.real

MIB = 1 << 20
REPO_ROOT = Path(__file__).resolve().parents[2]


# each case as `torpor push DIR` sends a layout (every byte hashed as it goes) and as
# `checkpoint --push` sends the blobs it has just written (unhashed: EarlyBlobs written_here)
BOTH_WAYS = pytest.mark.parametrize("written_here", [False, True], ids=["layout", "written-here"])


def push(layout: WrittenLayout, ref: str, options: RegistryOptions, written_here: bool) -> int:
    """Push the layout; its big blob first through EarlyBlobs when `written_here`. The number
    of blobs uploaded."""
    early = 0
    if written_here:
        with EarlyBlobs(ref, options) as ahead:
            for digest in layout.state_layers:
                ahead.submit(layout.root / "blobs" / "sha256" / digest.split(":")[1],
                             Descriptor("application/octet-stream", digest, layout.blobs[digest]),
                             written_here=True)
        early = ahead.uploaded
    pushed: PushResult = push_layout(layout.root, ref, options=options)
    return early + pushed.uploaded


@BOTH_WAYS
def test_push_resumes_at_the_registrys_offset(plain_registry: Registry, tmp_path: Path,
                                              written_here: bool) -> None:
    """The connection drops after the 2nd PATCH's headers: the registry still holds chunk 1 and
    says so (GET upload status, Range: 0-1048575); the push continues there, sending no byte twice."""
    layout = write_single_blob_layout(tmp_path / "layout", 5 * MIB)
    proxy = DroppingProxy(plain_registry.port, nth=2, body_bytes=0)
    try:
        uploaded = push(layout, f"{proxy.host}/resume/web1:1",
                        dataclasses.replace(FAST, chunk_size=MIB), written_here)
    finally:
        proxy.close()
    assert proxy.dropped and uploaded == 2
    assert proxy.forwarded_upstream < 5 * MIB + 64 * 1024, "resumed, not started again"
    assert_registry_holds(plain_registry, layout.state_layers[0], tmp_path)


@BOTH_WAYS
def test_push_starts_a_new_session_when_the_registry_refuses_to_resume(
        plain_registry: Registry, tmp_path: Path, written_here: bool) -> None:
    """The connection drops 300 kB into the 2nd PATCH: distribution 2.8 has written those bytes but
    refuses the old session ("upload resumed at wrong offset"), so the blob is sent again."""
    layout = write_single_blob_layout(tmp_path / "layout", 5 * MIB)
    proxy = DroppingProxy(plain_registry.port, nth=2, body_bytes=300_000)
    try:
        push(layout, f"{proxy.host}/resume/web1:1", dataclasses.replace(FAST, chunk_size=MIB),
             written_here)
    finally:
        proxy.close()
    assert proxy.dropped and proxy.forwarded_upstream > 6 * MIB
    assert_registry_holds(plain_registry, layout.state_layers[0], tmp_path)


@BOTH_WAYS
def test_monolithic_upload_starts_again_after_a_drop(plain_registry: Registry, tmp_path: Path,
                                                     written_here: bool) -> None:
    """A blob under the chunk size goes in one streamed PUT; a drop 1 MiB into it sends it again."""
    layout = write_single_blob_layout(tmp_path / "layout", 3 * MIB)
    proxy = DroppingProxy(plain_registry.port, nth=1, method=b"PUT", body_bytes=MIB)
    try:
        push(layout, f"{proxy.host}/resume/web1:1", dataclasses.replace(FAST, parallel=1),
             written_here)
    finally:
        proxy.close()
    assert proxy.dropped and proxy.forwarded_upstream > 4 * MIB
    assert_registry_holds(plain_registry, layout.state_layers[0], tmp_path)


def assert_registry_holds(registry: Registry, digest: str, tmp_path: Path) -> None:
    assert registry.blob_data(digest).exists()
    out = tmp_path / "pulled"
    pull(f"{registry.host}/resume/web1:1", out, options=FAST)
    assert (out / "blobs" / "sha256" / digest.split(":")[1]).exists()


STREAMING_CHILD = textwrap.dedent("""
    import json, resource, sys
    from torpor.registry import RegistryOptions, pull, push_layout
    layout, ref, out = sys.argv[1:4]
    def peak_kib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    before = peak_kib()
    options = RegistryOptions(parallel=2)
    pushed = push_layout(layout, ref, options=options)
    after_push = peak_kib()
    pulled = pull(ref, out, options=options)
    print(json.dumps({"before": before, "after_push": after_push, "after_pull": peak_kib(),
                      "uploaded": pushed.bytes_uploaded, "downloaded": pulled.bytes_downloaded}))
""")


def test_large_blobs_stream(plain_registry: Registry, tmp_path: Path) -> None:
    """A 200 MiB layer pushes and pulls while the process's peak RSS grows by far less than that."""
    size = 200 * MIB
    layout = write_single_blob_layout(tmp_path / "layout", size)
    result = subprocess.run([sys.executable, "-c", STREAMING_CHILD, str(layout.root),
                             f"{plain_registry.host}/big/web1:1", str(tmp_path / "out")],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    peaks = json.loads(result.stdout)
    assert peaks["uploaded"] == size + 2 and peaks["downloaded"] == size + 2  # the layer and "{}"
    grown_mib = (peaks["after_pull"] - peaks["before"]) / 1024
    assert grown_mib < 32, f"peak RSS grew by {grown_mib:.0f} MiB moving a 200 MiB blob: {peaks}"
    print(f"peak RSS grew by {grown_mib:.1f} MiB for a 200 MiB push and pull")


def test_blobs_sent_behind_a_dump_go_up_once_below_the_caller_until_it_is_over(
        plain_registry: Registry, tmp_path: Path) -> None:
    """`checkpoint --push` sends packs while CRIU dumps (EarlyBlobs.submit behind=True): their
    threads run nice.NICE below the main thread until `forward()` once the dump is over, after
    which one submitted even from a niced thread goes up at the main thread's nice; a blob
    submitted again (the build hands on every pack of the image) goes up once."""
    layout = write_single_blob_layout(tmp_path / "layout", 5 * MIB)
    digest = layout.state_layers[0]
    blob = Descriptor("application/octet-stream", digest, layout.blobs[digest])
    path = layout.root / "blobs" / "sha256" / digest.split(":")[1]
    main = os.getpriority(os.PRIO_PROCESS, os.getpid())

    def behind_nice() -> list[int]:
        return [os.getpriority(os.PRIO_PROCESS, t.native_id) for t in threading.enumerate()
                if t.name.startswith("torpor-early-push-behind") and t.native_id]

    def registry_holds(blob: str = digest, size: int = layout.blobs[digest]) -> bool:
        held = f"http://{plain_registry.host}/v2/behind/web/blobs/{blob}"
        try:
            with urllib.request.urlopen(urllib.request.Request(held, method="HEAD"),
                                        timeout=10) as answer:
                return int(answer.headers["Content-Length"]) == size
        except urllib.error.HTTPError:
            return False

    with EarlyBlobs(f"{plain_registry.host}/behind/web:1", FAST) as ahead:
        ahead.submit(path, blob, written_here=True, behind=True)
        ahead.submit(path, blob, written_here=True)
        deadline = time.monotonic() + 20
        while not registry_holds() and time.monotonic() < deadline:   # sent, its thread idle
            time.sleep(0.01)
        assert behind_nice() == [min(19, main + nice.NICE)]
        ahead.forward()
        assert behind_nice() == [main]
        # a blob submitted later from a niced thread (the packer's) goes up at main's nice
        other = write_single_blob_layout(tmp_path / "other", MIB)
        other_digest = other.state_layers[0]
        submitter = threading.Thread(target=lambda: (nice.lower_priority(), ahead.submit(
            other.root / "blobs" / "sha256" / other_digest.split(":")[1],
            Descriptor("application/octet-stream", other_digest, other.blobs[other_digest]),
            written_here=True, behind=True)))
        submitter.start()
        submitter.join()
        deadline = time.monotonic() + 20
        while not registry_holds(other_digest, other.blobs[other_digest]) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert {os.getpriority(os.PRIO_PROCESS, t.native_id) for t in threading.enumerate()
                if t.name.startswith("torpor-early-push") and t.native_id} == {main}
    assert (ahead.uploaded, ahead.bytes_uploaded) == (2, layout.blobs[digest]
                                                      + other.blobs[other_digest])
    assert registry_holds()
