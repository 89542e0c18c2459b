"""Extraction that cannot escape: every hostile archive of tests/support/hostile.py is refused
or extracted inside its target, and the canary tree outside is unchanged; limits stop an archive
before it is written; a refused archive leaves nothing; state layers hold only listed files."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from torpor import archive
from torpor.errors import ImageError, UnsafeArchive
from torpor.image import extract

from ..support.hostile import archive_escapes, entry, make_canary, tar_bytes, tree_digest, zstd

CANARY_CASES = sorted(archive_escapes(Path("/canary")))


@pytest.mark.parametrize("case", CANARY_CASES)
def test_hostile_archive_stays_inside(tmp_path: Path, case: str) -> None:
    canary = make_canary(tmp_path / "canary")
    mode, entries = archive_escapes(canary)[case]
    source = tmp_path / "hostile.tar"
    source.write_bytes(tar_bytes(entries))
    target = tmp_path / "deep" / "er" / "target"
    target.mkdir(parents=True)
    (target / "etc").mkdir()
    before = tree_digest(canary)
    try:
        archive.extract(str(source), str(target), mode)  # type: ignore[arg-type]
    except UnsafeArchive as e:
        assert str(e)
    assert tree_digest(canary) == before
    assert not list(tmp_path.rglob("*escaped*"))
    for path in target.rglob("*"):  # whatever was made is inside, and not a device
        assert not path.is_block_device() and not path.is_char_device()


def test_a_layer_applies_whiteouts_and_opaque_dirs_inside(tmp_path: Path) -> None:
    target = tmp_path / "rootfs"
    (target / "etc" / "old").mkdir(parents=True)
    (target / "etc" / "group").write_text("g")
    (target / "var").mkdir()
    (target / "var" / "gone").write_text("x")
    layer = tmp_path / "layer.tar"
    layer.write_bytes(tar_bytes([entry("etc/.wh.group"), entry("var/.wh..wh..opq"),
                                 entry("var/new", data=b"n"),
                                 entry("etc/link", tarfile.SYMTYPE, "/etc/passwd")]))
    archive.extract(str(layer), str(target), "layer")
    assert sorted(p.name for p in (target / "etc").iterdir()) == ["link", "old"]
    assert [p.name for p in (target / "var").iterdir()] == ["new"]
    assert os.readlink(target / "etc" / "link") == "/etc/passwd"   # data, never followed


def test_limits_stop_an_archive_before_anything_is_written(tmp_path: Path) -> None:
    source = tmp_path / "many.tar"
    source.write_bytes(tar_bytes([entry(f"f{i}", data=b"x" * 100) for i in range(20)]))
    target = tmp_path / "t"
    with pytest.raises(UnsafeArchive, match="more than 10 entries"):
        archive.extract(str(source), str(target), limits=archive.ArchiveLimits(max_entries=10))
    with pytest.raises(UnsafeArchive, match="add up to more than 1000"):
        archive.extract(str(source), str(target), limits=archive.ArchiveLimits(max_bytes=1000))
    assert not target.exists()   # made by extract, removed again


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_device_nodes_only_when_the_policy_allows(tmp_path: Path) -> None:
    source = tmp_path / "dev.tar"
    source.write_bytes(tar_bytes([entry("null", tarfile.CHRTYPE, major=1, minor=3, mode=0o666)]))
    with pytest.raises(UnsafeArchive, match="device node"):
        archive.extract(str(source), str(tmp_path / "a"))
    archive.extract(str(source), str(tmp_path / "b"), devices=True)
    assert (tmp_path / "b" / "null").is_char_device()
    assert (tmp_path / "b" / "null").stat().st_mode & 0o777 == 0o666


def _layer(tmp_path: Path, entries: list[tuple[tarfile.TarInfo, bytes]]) -> tuple[str, str, int]:
    import hashlib

    data = zstd(tar_bytes(entries))
    path = tmp_path / "layer.tar.zst"
    path.write_bytes(data)
    return str(path), "sha256:" + hashlib.sha256(data).hexdigest(), len(data)


def test_a_state_layer_holds_only_the_listed_files_at_their_sizes(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    listed = {"criu/pages-1.img": 4}
    path, digest, size = _layer(tmp_path, [entry("criu/pages-1.img", data=b"page")])
    extract.extract_layer(path, digest, size, str(target), ("criu",), "layer", listed)
    assert (target / "criu" / "pages-1.img").stat().st_mode & 0o777 == 0o600
    assert (target / "criu").stat().st_mode & 0o777 == 0o700
    path, digest, size = _layer(tmp_path, [entry("criu/extra.img", data=b"x")])
    with pytest.raises(UnsafeArchive, match="not a file the checkpoint's metadata lists"):
        extract.extract_layer(path, digest, size, str(target), ("criu",), "layer", listed)
    path, digest, size = _layer(tmp_path, [entry("criu/pages-1.img", data=b"pages!")])
    with pytest.raises(UnsafeArchive, match="says it is 6 bytes"):
        extract.extract_layer(path, digest, size, str(target), ("criu",), "layer", listed)
    budget = extract.Budget(3, 100)
    path, digest, size = _layer(tmp_path, [entry("criu/pages-1.img", data=b"page")])
    with pytest.raises(UnsafeArchive, match="more bytes than"):
        extract.extract_layer(path, digest, size, str(target), ("criu",), "layer", listed, budget)


def test_a_state_layer_never_writes_through_a_symlink(tmp_path: Path) -> None:
    canary = make_canary(tmp_path / "canary")
    target = tmp_path / "out"
    target.mkdir()
    (target / "criu").symlink_to(canary)
    before = tree_digest(canary)
    path, digest, size = _layer(tmp_path, [entry("criu/secret", data=b"evil")])
    with pytest.raises(ImageError, match="symlink"):
        extract.extract_layer(path, digest, size, str(target), ("criu",), "layer")
    assert tree_digest(canary) == before
