"""torpor-runc reads `[runtime] path` three ways: the compiled front end (shim/frontend.c) on
every runtime call, Python's plain reader (config.fast_parse) on the pass-through path, and
tomllib for everything else. They must never differ, or `create` and `checkpoint` run different
runtimes: over many config files, each plain reader gives tomllib's answer or declines (the
front end then runs the Python program; fast_parse hands the file to tomllib). The front end is
compiled here and run with a fake runtime on PATH and a fake Python that only says it ran."""

from __future__ import annotations

import os
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from torpor.config import fast_parse
from torpor.runtime_config.launchers import compile_frontend

FALLBACK = "python"
A, B = "/opt/rt/rt-a", "/opt/rt/rt-b"   # placeholders, replaced by the fake runtimes' paths

# (name, config text); RT_A and RT_B stand for the two fake runtimes
CONFIGS: list[tuple[str, str]] = [
    ("empty", ""),
    ("plain", '[runtime]\npath = "RT_A"\n'),
    ("literal string", "[runtime]\npath = 'RT_A'\n"),
    ("spaces and tabs", '  [ runtime ]  \n\tpath\t=\t"RT_A"  \n'),
    ("crlf", '[runtime]\r\npath = "RT_A"\r\n'),
    ("no final newline", '[runtime]\npath = "RT_A"'),
    ("comments", '# torpor\n[runtime] # the runtime\npath = "RT_A" # runc\n# end\n'),
    ("hash inside a string", '[runtime]\npath = "RT_A#x"\n'),
    ("other tables first", '[image]\nstore = "/s"\nzstd_level = 3\n[runtime]\npath = "RT_A"\n'),
    ("other tables after", '[runtime]\npath = "RT_A"\n[image]\nstore = "/s"\n'),
    ("a name on PATH", '[runtime]\npath = "rt-b"\n'),
    ("no runtime table", '[image]\nstore = "/s"\n'),
    ("runtime without path", '[runtime]\nstate_dir = "/run/x"\n'),
    ("restore on create", '[restore]\non_create = "signed"\n[runtime]\npath = "RT_A"\n'),
    ("restore on create not a string", '[restore]\non_create = true\n[runtime]\npath = "RT_A"\n'),
    ("lists and booleans", '[restore]\nhooks = ["/a", \'/b\',]\nallow_device_files = false\n'
                           '[runtime]\npath = "RT_A"\n'),
    ("integers", '[gpu]\nlock_timeout_ms = +5\ndriver_timeout_s = 0\n[runtime]\npath = "RT_A"\n'),
    ("dotted key at the root", 'runtime.path = "RT_A"\n'),
    ("dotted key with spaces", 'runtime . path = "RT_A"\n'),
    ("dotted key in a table", '[checkpoint]\nx = 1\n[runtime]\nsub.path = "RT_A"\n'),
    ("quoted table name", '["runtime"]\npath = "RT_A"\n'),
    ("literal quoted table", "['runtime']\npath = \"RT_A\"\n"),
    ("quoted key", '[runtime]\n"path" = "RT_A"\n'),
    ("inline table", 'runtime = { path = "RT_A" }\n'),
    ("sub-table", '[runtime.extra]\npath = "RT_B"\n[runtime]\npath = "RT_A"\n'),
    ("dotted header", '[runtime . extra]\npath = "RT_B"\n'),
    ("path under a sub-table only", '[runtime]\nstate_dir = "/r"\n[runtime.x]\npath = "RT_B"\n'),
    ("array of tables", '[[runtime]]\npath = "RT_A"\n'),
    ("multi-line string hiding a table", '[image]\nstore = """\n[runtime]\npath = "RT_B"\n"""\n'),
    ("multi-line literal hiding a table", "[image]\nstore = '''\n[runtime]\npath = \"RT_B\"\n'''\n"),
    ("multi-line string as the path", '[runtime]\npath = """RT_A"""\n'),
    ("multi-line array", '[restore]\nhooks = [\n  "/a",\n]\n[runtime]\npath = "RT_A"\n'),
    ("multi-line array hiding a path", '[restore]\nhooks = [\n"x" ]\npath = "RT_B"\n'),
    ("escape in the path", '[runtime]\npath = "RT_A\\u0041"\n'),
    ("escaped quote", '[runtime]\npath = "RT_A\\"x"\n'),
    ("duplicate key", '[runtime]\npath = "RT_A"\npath = "RT_B"\n'),
    ("duplicate table", '[runtime]\npath = "RT_A"\n[runtime]\nstate_dir = "/r"\n'),
    ("duplicate table with the path twice", '[runtime]\npath = "RT_A"\n[runtime]\npath = "RT_B"\n'),
    ("key, then a table of that name", 'runtime = "RT_A"\n[runtime]\npath = "RT_B"\n'),
    ("the path, then a table under it", '[runtime]\npath = "RT_A"\n[runtime.path]\nx = 1\n'),
    ("a table, then a key over it", '[runtime.path.x]\ny = 1\n[runtime]\npath = "RT_A"\n'),
    ("runtime a string", 'runtime = "RT_A"\n'),
    ("path an integer", '[runtime]\npath = 5\n'),
    ("path a list", '[runtime]\npath = ["RT_A"]\n'),
    ("path a boolean", '[runtime]\npath = true\n'),
    ("path empty", '[runtime]\npath = ""\n'),
    ("no value", '[runtime]\npath =\n'),
    ("no equals sign", '[runtime]\npath "RT_A"\n'),
    ("two values", '[runtime]\npath = "RT_A" "RT_B"\n'),
    ("trailing junk", '[runtime]\npath = "RT_A"x\n'),
    ("junk after a header", '[runtime] x\npath = "RT_A"\n'),
    ("unclosed header", '[runtime\npath = "RT_A"\n'),
    ("unclosed string", '[runtime]\npath = "RT_A\n'),
    ("leading zero", '[gpu]\nlock_timeout_ms = 007\n[runtime]\npath = "RT_A"\n'),
    ("underscore in a number", '[gpu]\nlock_timeout_ms = 1_000\n[runtime]\npath = "RT_A"\n'),
    ("float", '[gpu]\nlock_timeout_ms = 1.5\n[runtime]\npath = "RT_A"\n'),
    ("date", '[gpu]\nwhen = 1979-05-27\n[runtime]\npath = "RT_A"\n'),
    ("hex", '[gpu]\nlock_timeout_ms = 0x10\n[runtime]\npath = "RT_A"\n'),
    ("empty list item", '[restore]\nhooks = [,]\n[runtime]\npath = "RT_A"\n'),
    ("double comma", '[restore]\nhooks = ["/a",,"/b"]\n[runtime]\npath = "RT_A"\n'),
    ("nested list", '[restore]\nhooks = [["/a"], ["/b"]]\n[runtime]\npath = "RT_A"\n'),
    ("comma in a list's string", '[restore]\nhooks = ["/a,b"]\n[runtime]\npath = "RT_A"\n'),
    ("bare word", '[runtime]\npath = runc\n'),
    ("unicode key", '[runtime]\nclé = 1\npath = "RT_A"\n'),
    ("unicode in the path", '[runtime]\npath = "RT_A-é"\n'),
    ("unicode digits", '[gpu]\nlock_timeout_ms = \uff11\uff12\n[runtime]\npath = "RT_A"\n'),
    ("form feed", '\x0c[runtime]\npath = "RT_A"\n'),
    ("vertical tab in a string", '[runtime]\npath = "RT_A\x0b"\n'),
    ("lone carriage return", '[runtime]\rpath = "RT_B"\n'),
    ("line separator", '[runtime]\npath = "RT_A"\u2028path = "RT_B"\n'),
    ("control character in a comment", '# \x01\n[runtime]\npath = "RT_A"\n'),
    ("NUL", '[runtime]\npath = "RT_A"\n\x00'),
    ("bom", '\ufeff[runtime]\npath = "RT_A"\n'),
    ("true with junk", '[checkpoint]\nrootfs = truex\n[runtime]\npath = "RT_A"\n'),
    ("keys with dashes", '[x-y]\na-b = 1\n[runtime]\npath = "RT_A"\n'),
    ("digit keys", '[runtime]\n1234 = 1\npath = "RT_A"\n'),
    ("long line", '[runtime]\npath = "RT_A"\n# ' + "x" * 5000 + "\n"),
    ("many tables", "".join(f"[t{i}]\nk = {i}\n" for i in range(300)) + '[runtime]\npath = "RT_A"\n'),
]


def tomllib_runtime(text: str) -> str | None:
    """What tomllib reads as the runtime: `[runtime] path`, "runc" without one, None where the
    file is not valid TOML or the path is not a string in a table (Python reports those)."""
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None
    runtime = values.get("runtime", {})
    if not isinstance(runtime, dict):
        return None
    path = runtime.get("path", "runc")
    return path if isinstance(path, str) else None


@pytest.fixture(scope="module")
def front_end(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("front-end")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in ("rt-a", "rt-b", "runc"):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "ran {name}"\n')
        script.chmod(0o755)
    python = root / "python"
    python.write_text(f'#!/bin/sh\necho "{FALLBACK}"\n')
    python.chmod(0o755)
    binary = root / "torpor-runc"
    if not compile_frontend(str(binary), str(python), str(root / "script")):
        pytest.skip("no C compiler: the Python launcher stands in for the front end")
    yield binary, bin_dir


def front_end_runtime(front_end: tuple[Path, Path], config: Path) -> str:
    binary, bin_dir = front_end
    env = {"PATH": str(bin_dir), "TORPOR_CONFIG": str(config)}
    out = subprocess.run([str(binary), "state", "c1"], env=env, capture_output=True, text=True,
                         timeout=10).stdout.strip()
    return out.removeprefix("ran ")


@pytest.mark.parametrize(("name", "template"), CONFIGS, ids=[n for n, _ in CONFIGS])
def test_the_front_end_and_fast_parse_read_as_tomllib_or_decline(
        front_end: tuple[Path, Path], tmp_path: Path, name: str, template: str) -> None:
    bin_dir = front_end[1]
    text = template.replace("RT_A", str(bin_dir / "rt-a")).replace("RT_B", str(bin_dir / "rt-b"))
    config = tmp_path / "config.toml"
    config.write_bytes(text.encode("utf-8", "surrogatepass"))
    truth = tomllib_runtime(text)
    ran = front_end_runtime(front_end, config)
    expected = {FALLBACK} if truth is None else {FALLBACK, os.path.basename(truth)}
    assert ran in expected, (name, truth, ran)
    try:
        tomllib_values: object = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        tomllib_values = None
    fast = fast_parse(text)
    assert fast is None or fast == tomllib_values, (name, fast, tomllib_values)


def test_the_plain_forms_are_read_without_the_python_program(
        front_end: tuple[Path, Path], tmp_path: Path) -> None:
    """Declining is safe but slow (Python on every runtime call): the files torpor's own docs
    and installers write stay on the fast path."""
    plain = [n for n, _ in CONFIGS if n in {
        "empty", "plain", "literal string", "spaces and tabs", "crlf", "no final newline",
        "comments", "other tables first", "other tables after",
        "a name on PATH", "no runtime table", "runtime without path", "lists and booleans",
        "integers", "keys with dashes", "digit keys", "sub-table"}]
    for name in plain:
        template = dict(CONFIGS)[name]
        text = template.replace("RT_A", str(front_end[1] / "rt-a"))
        config = tmp_path / f"{len(name)}.toml"
        config.write_text(text)
        assert front_end_runtime(front_end, config) != FALLBACK, name
    assert fast_parse('[runtime]\npath = "/x"\n[restore]\nhooks = ["/a"]\n') == \
        {"runtime": {"path": "/x"}, "restore": {"hooks": ["/a"]}}
