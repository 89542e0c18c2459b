"""Spec modifiers are idempotent, keep unknown fields, and write config.json atomically."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from torpor.shim import modifiers, spec

BASE = {
    "ociVersion": "1.0.2",
    "process": {"args": ["sh"]},
    "root": {"path": "rootfs"},
    "x-vendor-extension": {"keep": [1, 2, 3]},
    "hooks": {"createRuntime": [{"path": "/usr/bin/other-hook", "args": ["other"]}]},
}


def hook() -> modifiers.HookModifier:
    return modifiers.HookModifier("/opt/torpor/bin/torpor-hook", "/run/torpor")


def test_adds_hooks_once() -> None:
    s = copy.deepcopy(BASE)
    assert modifiers.apply(s, [hook()]) is True
    once = copy.deepcopy(s)
    assert modifiers.apply(s, [hook()]) is False
    assert s == once
    assert s["hooks"]["createRuntime"][0]["path"] == "/usr/bin/other-hook"
    ours = s["hooks"]["createRuntime"][1]
    assert ours["path"] == "/opt/torpor/bin/torpor-hook"
    assert ours["args"][-1] == "createRuntime"
    assert s["hooks"]["poststop"][0]["args"][-1] == "poststop"
    assert s["x-vendor-extension"] == {"keep": [1, 2, 3]}


def test_replaces_hook_from_another_node() -> None:
    s = copy.deepcopy(BASE)
    modifiers.HookModifier("/elsewhere/torpor-hook", "/run/torpor").modify(s)
    assert hook().modify(s) is True
    paths = [h["path"] for h in s["hooks"]["createRuntime"]]
    assert paths == ["/usr/bin/other-hook", "/opt/torpor/bin/torpor-hook"]


def test_spec_without_hooks() -> None:
    s = {"ociVersion": "1.0.2"}
    assert hook().modify(s)
    assert set(s["hooks"]) == {"createRuntime", "poststop"}


def test_flush_is_atomic_and_keeps_mode(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BASE))
    path.chmod(0o600)
    s = spec.load(str(tmp_path))
    hook().modify(s)
    spec.flush(str(tmp_path), s)
    assert json.loads(path.read_text()) == s
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_removes_every_hook_that_calls_itself_torpors_at_any_stage() -> None:
    """args[0] is only a name: a prestart host program calling itself torpor-hook is dropped,
    and torpor's own entries at createRuntime and poststop are this node's."""
    s = copy.deepcopy(BASE)
    s["hooks"]["prestart"] = [{"path": "/bin/sh", "args": ["torpor-hook", "-c", "id"]},
                              {"path": "/usr/bin/kept", "args": ["kept"]}]
    s["hooks"]["createRuntime"].append({"path": "/bin/sh", "args": ["torpor-hook", "-c", "x"]})
    assert modifiers.apply(s, [hook()]) is True
    assert s["hooks"]["prestart"] == [{"path": "/usr/bin/kept", "args": ["kept"]}]
    paths = [h["path"] for h in s["hooks"]["createRuntime"]]
    assert paths == ["/usr/bin/other-hook", "/opt/torpor/bin/torpor-hook"]
    once = copy.deepcopy(s)
    assert modifiers.apply(s, [hook()]) is False and s == once
