"""torpor-hook's compiled createRuntime (frontend.c, `hook`): where torpor-runc's plan for a
restored network namespace only brings lo up, the front end does it itself, finding the plan
where torpor.capture.records puts it; anything else goes to the Python hook with the OCI state
handed on as its stdin. The namespaces here are the test's own (`unshare -n sleep`, by pid)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from torpor.capture import netns, records
from torpor.formats import names
from torpor.formats.network import Address, RestorePlan
from torpor.oci_hooks import main as oci_hook
from torpor.runtime_config.launchers import compile_frontend

from .namespaces import own_network_namespace

SOURCE = Path(__file__).resolve().parents[2] / "torpor" / "shim" / "frontend.c"
LO_ONLY = RestorePlan(("lo",), (), ())


def define(name: str) -> str:
    found = re.search(rf'^#define {name} (".*")$', SOURCE.read_text(), re.MULTILINE)
    assert found, name
    return str(json.loads(found.group(1)))


def test_the_front_end_knows_what_the_python_side_writes() -> None:
    assert define("LO_ONLY_PLAN") == json.dumps(LO_ONLY.to_json())
    assert define("RECORDS_DIR") == names.RECORDS_DIR
    assert define("RESTORE_PLAN") == names.RESTORE_PLAN
    assert define("HOOK_STATE_DIR") == oci_hook.DEFAULT_STATE_DIR


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hook")
    python = root / "python"   # says it ran, and keeps the stdin it was given
    python.write_text(f'#!/bin/sh\ncat > "{root}/stdin"\necho "python ran ${{2##*/}} $3 $4 $5"\n')
    python.chmod(0o755)
    binary = root / "torpor-runc"
    if not compile_frontend(str(binary), str(python), str(root / "torpor-runc.py"),
                            hook=str(root / "torpor-hook.py")):
        pytest.skip("no C compiler: torpor-hook is its Python launcher")
    named = root / "bin" / "torpor-hook"
    named.parent.mkdir()
    shutil.copy2(binary, named)
    return named


@pytest.fixture
def namespace() -> Iterator[int]:
    """A process in a network namespace of its own, whose lo is down."""
    with own_network_namespace() as pid:
        yield pid


def lo_is_up(pid: int) -> bool:
    shown = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-o", "link", "show",
                            "lo"], capture_output=True, text=True, check=True).stdout
    flags = re.search(r"<([^>]*)>", shown)
    assert flags, shown
    return "UP" in flags.group(1).split(",")


def run_hook(hook: Path, state_dir: Path, state: dict[str, object] | str,
             name: str = "createRuntime") -> subprocess.CompletedProcess[str]:
    text = state if isinstance(state, str) else json.dumps(state)
    return subprocess.run([str(hook), "--state-dir", str(state_dir), name], input=text,
                          capture_output=True, text=True, timeout=20, env={"PATH": "/bin"})


@pytest.mark.parametrize(("bundle", "container_id", "runc_says"), [
    ("run/containerd/io.containerd.runtime.v2.task/k8s.io/web", "web", None),   # its namespace
    ("var/lib/containers/storage/overlay-containers/abc/userdata", "abc", None),
    # given through a symlink (/var/run -> /run): runc's state names the real directory
    ("link/containerd/io.containerd.runtime.v2.task/default/c1", "c1", "real"),
    ("real/containerd/io.containerd.runtime.v2.task/default/c2", "c2", "link"),
])
def test_a_plan_that_only_brings_lo_up_is_done_without_python(
        hook: Path, tmp_path: Path, namespace: int, bundle: str, container_id: str,
        runc_says: str | None) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    given = tmp_path / bundle
    given.mkdir(parents=True, exist_ok=True)
    seen = tmp_path / (runc_says + bundle[4:]) if runc_says else given
    bundle = str(given)
    plan = Path(records.record_dir(str(tmp_path), bundle, container_id)) / names.RESTORE_PLAN
    netns.write_restore_plan(str(plan), LO_ONLY)
    assert not lo_is_up(namespace)
    state = {"ociVersion": "1.2.0", "id": container_id, "status": "creating",
             "pid": namespace, "bundle": str(seen),
             "annotations": {"x": "a \"quoted\" {brace} [and] \\ more"}}
    result = run_hook(hook, tmp_path, state)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert lo_is_up(namespace)
    assert not plan.exists()   # applied: gone, as the Python hook leaves it


def test_no_plan_is_nothing_to_do(hook: Path, tmp_path: Path) -> None:
    result = run_hook(hook, tmp_path, {"id": "c", "bundle": "/", "pid": 1})
    assert (result.returncode, result.stdout) == (0, "")


INVALID = {   # what Python's JSON refuses: the Python hook says so, and does nothing
    "not json": "{not json",
    "trailing comma": '{"id": "c", "bundle": "/x/c", "pid": 1,}',
    "pid with a zero first": '{"id": "c", "bundle": "/x/c", "pid": 0123}',
    "pid with a sign": '{"id": "c", "bundle": "/x/c", "pid": +1}',
    "a bare word": '{"id": "c", "bundle": "/x/c", "pid": 1, "x": tru}',
    "a bad number": '{"id": "c", "bundle": "/x/c", "pid": 1, "x": -}',
    "a bad escape": '{"id": "c", "bundle": "/x/c", "pid": 1, "x": "\\q"}',
    "a short unicode escape": '{"id": "c", "bundle": "/x/c", "pid": 1, "x": "\\u12"}',
}


@pytest.mark.parametrize("case", ["addresses", "escaped bundle", "unnormal bundle", "poststop",
                                  "non-ascii", "over a mebibyte", *INVALID])
def test_everything_else_goes_to_the_python_hook_with_its_stdin(
        hook: Path, tmp_path: Path, case: str) -> None:
    bundle, container_id = "/x/c", "c"
    state: dict[str, object] | str = {"id": container_id, "bundle": bundle, "pid": 1}
    name = "createRuntime"
    plan = Path(records.record_dir(str(tmp_path), bundle, container_id)) / names.RESTORE_PLAN
    netns.write_restore_plan(str(plan), LO_ONLY)   # a plan the front end would apply itself
    if case == "addresses":
        netns.write_restore_plan(str(plan), RestorePlan(("lo",), (Address(
            ifname="lo", family="inet", address="10.1.2.3", prefixlen=32, scope=0),), ()))
    elif case == "escaped bundle":
        state = '{"id": "c", "bundle": "/x\\/c", "pid": 1}'
    elif case == "unnormal bundle":
        state = {"id": "c", "bundle": "/x//c", "pid": 1}
    elif case == "poststop":
        name = "poststop"
    elif case == "non-ascii":   # raw UTF-8 (Go's encoder writes it so)
        state = json.dumps({"id": "c", "bundle": "/x/c", "pid": 1, "annotations": {"a": "é"}},
                           ensure_ascii=False)
    elif case == "over a mebibyte":   # all of it reaches the Python hook
        state = {"id": "c", "bundle": "/x/c", "pid": 1, "annotations": {"a": "x" * (2 << 20)}}
    else:
        state = INVALID[case]
    result = run_hook(hook, tmp_path, state, name)
    assert result.stdout == f"python ran torpor-hook.py --state-dir {tmp_path} {name}\n"
    sent = state if isinstance(state, str) else json.dumps(state)
    assert (hook.parent.parent / "stdin").read_text() == sent   # byte for byte
    assert plan.exists()   # the front end left it to Python


@pytest.mark.parametrize(("pid", "why"), [(999999999, "No such file or directory"),
                                          (0, "No such process")])
def test_a_failure_says_so_and_the_plan_goes(hook: Path, tmp_path: Path, pid: int,
                                             why: str) -> None:
    bundle = tmp_path / "c"
    bundle.mkdir()
    plan = Path(records.record_dir(str(tmp_path), str(bundle), "c")) / names.RESTORE_PLAN
    netns.write_restore_plan(str(plan), LO_ONLY)
    result = run_hook(hook, tmp_path, {"id": "c", "bundle": str(bundle), "pid": pid})
    assert result.returncode == 1
    assert "torpor-hook: createRuntime failed: bringing lo up" in result.stderr
    assert why in result.stderr
    assert not plan.exists()
