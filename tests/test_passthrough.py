"""torpor-runc is invisible where it should be: a fake runc on PATH records exactly what it got.

torpor-runc is a compiled front end that execs runc for every call but checkpoint and restore;
where no C compiler is found it is its Python program (lib/torpor-runc.py), which must behave the
same. Both are checked here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

FAKE = Path(__file__).parent / "fakes" / "fake_runc.py"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


@pytest.fixture(params=["front-end", "python"])
def fake(request: pytest.FixtureRequest, tmp_path: Path, torpor_bin: Path) -> dict[str, object]:
    config = tmp_path / "torpor.toml"
    config.write_text(f'[runtime]\npath = "{FAKE}"\nstate_dir = "{tmp_path}/state"\n')
    env = {"PATH": "/usr/bin:/bin", "TORPOR_CONFIG": str(config),
           "FAKE_RUNC_RECORD": str(tmp_path / "record.json"), "HOME": "/root", "LANG": "C.UTF-8"}
    runc = torpor_bin / "torpor-runc" if request.param == "front-end" else python_program(torpor_bin)
    return {"env": env, "record": tmp_path / "record.json", "runc": str(runc), "dir": tmp_path}


def python_program(torpor_bin: Path) -> Path:
    return torpor_bin.parent / "lib" / "torpor-runc.py"


def run(fake: dict[str, object], args: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
    env = {**fake["env"], **kw.pop("env", {})}  # type: ignore[dict-item]
    return subprocess.run([fake["runc"], *args], env=env, capture_output=True, **kw)  # type: ignore


def record(fake: dict[str, object]) -> dict:
    return json.loads(Path(fake["record"]).read_text())  # type: ignore[arg-type]


ARGVS = [
    ["state", "c1"],
    ["create", "--bundle", "/b", "--pid-file", "/b/init.pid", "--console-socket", "/s", "c1"],
    ["start", "c1"],
    ["run", "-d", "--bundle", "/b", "c1"],
    ["checkpoint", "--help"],
    ["--root", "/r", "restore", "-h"],
    ["--root", "/run/containerd/runc/ns", "--log", "/b/log.json", "--log-format", "json", "kill",
     "--all", "c1", "9"],
    ["--root=/r", "delete", "--force", "c1"],
    ["ps", "--format", "json", "c1"],
    ["exec", "--process", "/tmp/p.json", "--detach", "--pid-file", "/b/e.pid", "c1"],
    ["update", "--resources", "-", "c1"],
    ["--systemd-cgroup", "pause", "c1"],
    ["features"],
    ["--version"],
    ["some-future-command", "--with", "-odd-flags", "--x=y", "c1"],
    ["list", "-q", "-no-such-thing"],
    ["kill", "c1", "KILL", "--", "--weird"],
]


@pytest.mark.parametrize("args", ARGVS)
def test_argv_is_passed_byte_exact(fake: dict[str, object], args: list[str]) -> None:
    result = run(fake, args)
    assert result.returncode == 0, result.stderr
    got = record(fake)
    assert got["argv"][1:] == args
    assert result.stderr == b""


def test_same_process_stdout_stdin_and_exit_status(fake: dict[str, object]) -> None:
    proc = subprocess.Popen([fake["runc"], "ps", "--format", "json", "c1"], env={
        **fake["env"], "FAKE_RUNC_STDOUT": "[1,2,3]", "FAKE_RUNC_EXIT": "42",
        "FAKE_RUNC_READ_STDIN": "1"}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    out, err = proc.communicate(b"resources on stdin")
    assert proc.returncode == 42
    assert out == b"[1,2,3]" and err == b""
    got = record(fake)
    assert got["pid"] == proc.pid  # execve: no process in between, signals go straight to runc
    assert got["stdin"] == "resources on stdin"


def test_environment_is_kept(fake: dict[str, object]) -> None:
    run(fake, ["state", "x"], env={"NOTIFY_SOCKET_X": "/s", "XDG_RUNTIME_DIR": "/run/user/0"})
    env = record(fake)["env"]
    assert env["NOTIFY_SOCKET_X"] == "/s" and env["XDG_RUNTIME_DIR"] == "/run/user/0"
    assert env["TORPOR_CONFIG"] == fake["env"]["TORPOR_CONFIG"]  # type: ignore[index]


def test_inherited_fds_survive(fake: dict[str, object]) -> None:
    r, w = os.pipe()
    try:
        proc = subprocess.run([fake["runc"], "exec", "--preserve-fds", "1", "c1"],
                              env=fake["env"], close_fds=False, capture_output=True,
                              preexec_fn=lambda: os.dup2(r, 3))  # fd 3, as containerd passes it
        assert proc.returncode == 0
        fds = record(fake)["fds"]
        assert fds["3"] == os.readlink(f"/proc/self/fd/{r}")
    finally:
        os.close(r)
        os.close(w)


def test_create_leaves_the_spec_alone(fake: dict[str, object], tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "x-keep": 1}))
    before = (bundle / "config.json").stat()
    result = run(fake, ["create", "--bundle", str(bundle), "--pid-file", "/p", "c9"])
    assert result.returncode == 0, result.stderr
    assert record(fake)["argv"][1:] == ["create", "--bundle", str(bundle), "--pid-file", "/p", "c9"]
    after = (bundle / "config.json").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_malformed_config_is_a_clear_error_and_left_alone(fake: dict[str, object],
                                                          tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_bytes(b'{"ociVersion": "1.0.2", ')
    log = tmp_path / "log.json"
    Path(fake["record"]).unlink(missing_ok=True)  # type: ignore[arg-type]
    result = run(fake, ["--log", str(log), "--log-format", "json", "restore", "--bundle",
                        str(bundle), "c1"])
    assert result.returncode == 2
    assert result.stdout == b""
    assert (bundle / "config.json").read_bytes() == b'{"ociVersion": "1.0.2", '
    assert not Path(fake["record"]).exists()  # type: ignore[arg-type]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[-1]["level"] == "error"
    assert "config.json is not valid JSON" in lines[-1]["msg"]
    assert RFC3339.match(lines[-1]["time"])


def test_log_text_format_and_stderr(fake: dict[str, object], tmp_path: Path) -> None:
    bundle = tmp_path / "nothing-here"
    result = run(fake, ["restore", "--bundle", str(bundle), "c1"])
    assert result.returncode == 2 and result.stdout == b""
    assert b'level=error msg="torpor: ' in result.stderr
    assert b"does not exist" in result.stderr


def test_missing_low_level_runtime_is_named(tmp_path: Path, torpor_bin: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[runtime]\npath = "/opt/no/such/runc"\n')
    log = tmp_path / "log.json"
    result = subprocess.run([torpor_bin / "torpor-runc", "--log", log, "--log-format", "json",
                             "state", "x"], env={"TORPOR_CONFIG": str(config), "PATH": "/usr/bin"},
                            capture_output=True)
    assert result.returncode == 127
    msg = json.loads(log.read_text().splitlines()[-1])["msg"]
    assert "/opt/no/such/runc does not exist" in msg


def test_never_resolves_to_itself(tmp_path: Path, torpor_bin: Path) -> None:
    """On the shim launcher's PATH `runc` is torpor-runc; the real runc must still be found."""
    runc_dir = torpor_bin.parent / "lib" / "runc"
    result = subprocess.run([runc_dir / "runc", "--version"], capture_output=True, text=True,
                            env={"PATH": f"{runc_dir}:/usr/local/sbin:/usr/sbin:/usr/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("runc version")
    # and a runtime that leads back to torpor-runc is refused, not looped
    config = tmp_path / "c.toml"
    config.write_text(f'[runtime]\npath = "{runc_dir}/runc"\n')
    result = subprocess.run([torpor_bin / "torpor-runc", "state", "x"], capture_output=True,
                            text=True, env={"TORPOR_CONFIG": str(config), "PATH": "/usr/bin"})
    assert result.returncode == 127
    assert "torpor-runc itself" in result.stderr


def test_bad_config_file_is_reported(tmp_path: Path, torpor_bin: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[runtime]\npaht = 'typo'\n")
    env = {"TORPOR_CONFIG": str(config), "PATH": "/usr/bin"}
    result = subprocess.run([torpor_bin / "torpor-runc", "restore", "--bundle", str(tmp_path),
                             "x"], capture_output=True, text=True, env=env)
    assert result.returncode == 2
    assert "unknown key(s) in [runtime]: paht" in result.stderr
    config.write_text("[runtime\npath = 'x'\n")  # not TOML: reported on every call
    result = subprocess.run([torpor_bin / "torpor-runc", "state", "x"], capture_output=True,
                            text=True, env=env)
    assert result.returncode == 2
    assert "is not valid TOML" in result.stderr


def test_fast_path_starts_no_python_and_the_fallback_imports_nothing_heavy(
        fake: dict[str, object], tmp_path: Path) -> None:
    """state/kill/delete: the front end execs runc without Python; its Python fallback does not
    pay for grpc, pyroute2, click, zstandard, ctypes, typing or json."""
    quiet_runc = tmp_path / "runc"  # not Python: its own imports would blur the picture
    quiet_runc.write_text("#!/bin/sh\nexit 0\n")
    quiet_runc.chmod(0o755)
    config = tmp_path / "fast.toml"
    config.write_text(f'# a comment\n[runtime]\npath = "{quiet_runc}"\nstate_dir = "/run/t"\n'
                      '[checkpoint]\nvolumes = "all"\n')
    heavy_packages = {"grpc", "pyroute2", "click", "zstandard", "ctypes", "_ctypes", "typing",
                      "json", "tomllib", "google", "pynvml"}
    for args in (["state", "c"], ["kill", "c", "9"], ["delete", "c"], ["create", "c"]):
        result = run(fake, args, env={"PYTHONPROFILEIMPORTTIME": "1",
                                      "TORPOR_CONFIG": str(config)})
        assert result.returncode == 0
        imported = {line.split("|")[-1].strip() for line in result.stderr.decode().splitlines()
                    if line.startswith("import time:")}
        if str(fake["runc"]).endswith(".py"):
            assert "torpor.shim.main" in imported
            heavy = {m for m in imported if m.split(".")[0] in heavy_packages}
            assert not heavy, f"{args[0]} imported {sorted(heavy)}"
        else:
            assert imported == set(), f"{args[0]} started Python"


def test_launcher_uses_this_interpreter(torpor_bin: Path) -> None:
    first = python_program(torpor_bin).read_text().splitlines()[0]
    assert first == f"#!{sys.executable} -S"
    assert (torpor_bin / "torpor-runc").read_bytes()[:4] == b"\x7fELF"  # the compiled front end


@pytest.mark.parametrize(("text", "expected"), [
    ("", "runc"),
    ('[runtime]\npath = "/usr/sbin/runc"\n', "/usr/sbin/runc"),
    ("[runtime]\npath = '/opt/runc'\n[gpu]\nlock_timeout_ms = 5\n", "/opt/runc"),
    ('[checkpoint]\npath = "/not/this"\n', "runc"),
    ('runtime.path = "/x"\n', None),
    ('[runtime]\npath = """/x"""\n', None),
    ('[runtime]\npath = "/a\\\\b"\n', None),
    ("[[runtime]]\n", None),
])
def test_fast_config_read(text: str, expected: str | None) -> None:
    from torpor.config import fast_runtime_path

    fast = fast_runtime_path(text)
    assert (fast[0] if fast else None) == expected


def test_restore_on_create_costs_ordinary_creates_nothing(fake: dict[str, object],
                                                          tmp_path: Path) -> None:
    """`[restore] on_create` on: create and start of an ordinary container still start no
    Python (the front end) or nothing heavy (its fallback); a create whose spec carries the
    checkpoint mark goes to torpor-runc's create (which restores only under containerd: said in
    words here), unless the cold-start annotation asks for runc; a start of a container restored
    at create (its mark under runc's root) is torpor-runc's, and runc is not asked."""
    quiet_runc = tmp_path / "runc"
    quiet_runc.write_text("#!/bin/sh\nexit 0\n")
    quiet_runc.chmod(0o755)
    config = tmp_path / "on-create.toml"
    config.write_text(f'[runtime]\npath = "{quiet_runc}"\nstate_dir = "{tmp_path}/state"\n'
                      '[restore]\non_create = "signed"\n')
    plain, marked, cold = (tmp_path / name for name in ("plain", "marked", "cold"))
    process = {"args": ["sh"], "env": ["PATH=/bin"]}
    mark = "TORPOR_CHECKPOINT=torpor.checkpoint.v1"
    for bundle, spec in ((plain, {"process": process}),
                         (marked, {"process": {**process, "env": ["PATH=/bin", mark]}}),
                         (cold, {"process": {**process, "env": [mark]},
                                 "annotations": {"io.torpor.restore.cold-start": "true"}})):
        bundle.mkdir()
        (bundle / "config.json").write_text(json.dumps(spec))
    heavy_packages = {"grpc", "pyroute2", "click", "zstandard", "ctypes", "_ctypes", "typing",
                      "json", "tomllib", "google"}
    env = {"PYTHONPROFILEIMPORTTIME": "1", "TORPOR_CONFIG": str(config)}
    for args in (["create", "--bundle", str(plain), "c"], ["create", "-b", str(plain), "c"],
                 ["--root", str(tmp_path / "root"), "start", "c"]):
        result = run(fake, args, env=env)
        assert result.returncode == 0, result.stderr
        imported = {line.split("|")[-1].strip() for line in result.stderr.decode().splitlines()
                    if line.startswith("import time:")}
        if str(fake["runc"]).endswith(".py"):
            heavy = {m for m in imported if m.split(".")[0] in heavy_packages}
            assert not heavy, f"{args} imported {sorted(heavy)}"
        else:
            assert imported == set(), f"{args} started Python"
    refused = run(fake, ["create", "--bundle", str(marked), "c"], env={"TORPOR_CONFIG": str(config)})
    assert refused.returncode == 1
    assert b"restore on create works under containerd only" in refused.stderr
    assert run(fake, ["create", "--bundle", str(cold), "c"],
               env={"TORPOR_CONFIG": str(config)}).returncode == 0
    # a container restored at create: its start is torpor-runc's, runc's is not run
    restored = tmp_path / "root" / "c"
    restored.mkdir(parents=True)
    (restored / "torpor-restored-on-create").touch()
    (tmp_path / "runc").write_text("#!/bin/sh\nexit 7\n")
    started = run(fake, ["--root", str(tmp_path / "root"), "start", "c"],
                  env={"TORPOR_CONFIG": str(config)})
    assert started.returncode == 0, started.stderr
    assert not (restored / "torpor-restored-on-create").exists()
    again = run(fake, ["--root", str(tmp_path / "root"), "start", "c"],
                env={"TORPOR_CONFIG": str(config)})
    assert again.returncode == 7   # runc's again
