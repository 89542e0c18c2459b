"""One read-write layer out of two (torpor/image/rw_merge.py): applied to any base, the merged
layer gives the same file system as the older layer then the newer one, by OCI's layer rules
(whiteouts, opaque directories, a file replacing a directory, hard links)."""

from __future__ import annotations

import io
import tarfile

import pytest

from torpor.image.rw_merge import merge

Tree = dict[str, tuple[str, bytes]]  # path -> ("dir" | "file", content)
Entry = tuple[str, str, bytes | str]  # (kind: dir, file, link, whiteout, opaque; path; data)


def layer(*entries: Entry) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        for kind, path, data in entries:
            if kind == "whiteout":
                parent, _, leaf = path.rpartition("/")
                path, kind, data = f"{parent}/.wh.{leaf}".lstrip("/"), "file", b""
            elif kind == "opaque":
                path, kind, data = f"{path}/.wh..wh..opq", "file", b""
            info = tarfile.TarInfo(path)
            info.mtime = 1700000000
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.LNKTYPE, str(data)
                tar.addfile(info)
            else:
                assert isinstance(data, bytes)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def apply(tree: Tree, blob: bytes) -> Tree:
    """What containerd's applier makes of a layer over `tree` (the rules the merge keeps)."""
    fs, seen = dict(tree), set()

    def remove(path: str) -> None:
        for key in [k for k in fs if k == path or k.startswith(path + "/")]:
            del fs[key]

    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
        for member in tar.getmembers():
            path = member.name.strip("/")
            parent, _, leaf = path.rpartition("/")
            if leaf == ".wh..wh..opq":
                for key in [k for k in fs if k.startswith(parent + "/") and k not in seen]:
                    del fs[key]
                continue
            if leaf.startswith(".wh."):
                remove(f"{parent}/{leaf[4:]}".lstrip("/"))
                continue
            if path in fs and not (member.isdir() and fs[path][0] == "dir"):
                remove(path)
            if member.isdir():
                fs[path] = ("dir", b"")
            elif member.islnk():
                fs[path] = fs[member.linkname.strip("/")]
            else:
                data = tar.extractfile(member)
                assert data is not None
                fs[path] = ("file", data.read())
            seen.add(path)
    return fs


def merged(older: bytes, newer: bytes) -> bytes:
    out = io.BytesIO()
    merge(io.BytesIO(older), io.BytesIO(newer), out)
    return out.getvalue()


BASE: Tree = {
    "etc": ("dir", b""), "etc/conf": ("dir", b""), "etc/conf/a": ("file", b"base a"),
    "etc/conf/b": ("file", b"base b"), "opt": ("dir", b""), "opt/x": ("file", b"base x"),
    "srv": ("dir", b""), "srv/old": ("file", b"base old"), "tmp": ("dir", b""),
}

CASES: dict[str, tuple[bytes, bytes]] = {
    "the newer writes a file the older wrote": (
        layer(("dir", "tmp", b""), ("file", "tmp/count", b"41")),
        layer(("dir", "tmp", b""), ("file", "tmp/count", b"42"))),
    "the newer removes one of the older's files": (
        layer(("dir", "tmp", b""), ("file", "tmp/f1", b"1"), ("file", "tmp/f2", b"2")),
        layer(("dir", "tmp", b""), ("whiteout", "tmp/f1", b""))),
    "the older removed a directory the newer makes again": (
        layer(("dir", "etc", b""), ("whiteout", "etc/conf", b"")),
        layer(("dir", "etc", b""), ("dir", "etc/conf", b""), ("file", "etc/conf/new", b"n"))),
    "the newer makes a directory of the older's opaque": (
        layer(("dir", "w", b""), ("file", "w/a", b"a"), ("file", "w/b", b"b")),
        layer(("dir", "w", b""), ("opaque", "w", b""), ("file", "w/c", b"c"))),
    "the older's opaque directory gets more files": (
        layer(("dir", "srv", b""), ("opaque", "srv", b""), ("file", "srv/a", b"a")),
        layer(("dir", "srv", b""), ("file", "srv/b", b"b"))),
    "a file replaces the older's directory": (
        layer(("dir", "r", b""), ("file", "r/inner", b"i")),
        layer(("file", "r", b"now a file"))),
    "the newer changes what an older hard link points to": (
        layer(("dir", "tmp", b""), ("file", "tmp/h1", b"one"), ("link", "tmp/h2", "tmp/h1")),
        layer(("dir", "tmp", b""), ("file", "tmp/h1", b"changed"))),
    "the newer removes a base directory the older changed": (
        layer(("dir", "opt", b""), ("file", "opt/x", b"older x"), ("file", "opt/y", b"y")),
        layer(("whiteout", "opt", b""))),
    "the newer removes a file the older removed too": (
        layer(("dir", "srv", b""), ("whiteout", "srv/old", b"")),
        layer(("dir", "srv", b""), ("whiteout", "srv/old", b""))),
    "nothing new": (
        layer(("dir", "tmp", b""), ("file", "tmp/count", b"7")),
        layer()),
}


def whiteouts_meet_entries(blob: bytes) -> list[str]:
    """OCI: a whiteout applies only to lower layers, so one layer must not both whiteout a
    path and hold it (or anything below it): appliers differ on which wins."""
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
        names = [m.name.strip("/") for m in tar.getmembers()]
    gone = {f"{n.rpartition('/')[0]}/{n.rpartition('/')[2][4:]}".lstrip("/") for n in names
            if n.rpartition("/")[2].startswith(".wh.") and not n.endswith(".wh..wh..opq")}
    return [n for n in names if any(n == g or n.startswith(g + "/") for g in gone)]


@pytest.mark.parametrize("case", list(CASES))
def test_the_merged_layer_makes_the_same_tree(case: str) -> None:
    older, newer = CASES[case]
    blob = merged(older, newer)
    assert apply(BASE, blob) == apply(apply(BASE, older), newer)
    assert whiteouts_meet_entries(blob) == []


def test_the_older_removal_of_a_remade_directory_becomes_its_opaque_marker() -> None:
    older, newer = CASES["the older removed a directory the newer makes again"]
    with tarfile.open(fileobj=io.BytesIO(merged(older, newer))) as tar:
        names = tar.getnames()
    assert "etc/conf/.wh..wh..opq" in names and "etc/.wh.conf" not in names
    assert names.index("etc/conf/.wh..wh..opq") < names.index("etc/conf/new")


def test_the_same_layers_merge_to_the_same_bytes() -> None:
    older, newer = CASES["the newer writes a file the older wrote"]
    assert merged(older, newer) == merged(older, newer)
