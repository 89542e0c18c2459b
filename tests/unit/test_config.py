"""torpor's configuration: defaults in one place, the rendered file, and refusals in words."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from torpor import config
from torpor.errors import ConfigError


def test_no_file_means_every_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORPOR_CONFIG", raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "none.toml"))
    cfg = config.load()
    assert (cfg.runtime_path, cfg.runtime_state_dir, cfg.image_store, cfg.checkpoint_volumes,
            cfg.gpu_lock_timeout_ms) == ("runc", "/run/torpor", "/var/lib/torpor", "all", 10000)


def test_the_rendered_defaults_are_the_defaults(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.toml"
    path.write_text(config.render_defaults())
    assert tomllib.loads(path.read_text()) == {t: {} for t in config._SCHEMA}
    assert config.fast_parse(path.read_text()) == {t: {} for t in config._SCHEMA}
    uncommented = "\n".join(line[2:].split("  #")[0] if line.startswith("# ") and " = " in line
                            else line for line in path.read_text().splitlines())
    path.write_text(uncommented)
    monkeypatch.setenv("TORPOR_CONFIG", str(path))
    assert vars_of(config.load()) == vars_of(config.Config())


def vars_of(cfg: config.Config) -> dict[str, object]:
    return {name: getattr(cfg, name) for name in config.Config.__slots__ if name != "path"}


@pytest.mark.parametrize("text, message", [
    ("[runtime]\npaht = 'runc'\n", "unknown key"),
    ("[image]\nzstd_level = 'fast'\n", "wrong type"),
    ("[gpus]\n", "unknown table"),
    ("[runtime\n", "not valid TOML"),
])
def test_mistakes_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str,
                            message: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    monkeypatch.setenv("TORPOR_CONFIG", str(path))
    with pytest.raises(ConfigError, match=message):
        config.load()


def test_the_fast_path_reads_the_runtime_path() -> None:
    assert config.fast_runtime_path('[runtime]\npath = "/opt/runc"\n') == ("/opt/runc", False)
    assert config.fast_runtime_path("# nothing\n") == ("runc", False)
    assert config.fast_runtime_path('[restore]\non_create = "signed"\n') == ("runc", True)
    assert config.fast_runtime_path('[restore]\non_create = "off"\n') == ("runc", False)
    assert config.fast_runtime_path("[restore]\non_create = 1\n") is None  # Config says why
    assert config.fast_runtime_path("[runtime]\npath = '''x'''\n") is None  # left to tomllib


def test_the_docs_show_the_rendered_defaults() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "containerd.md").read_text()
    assert config.render_defaults().rstrip() in docs


@pytest.mark.parametrize("table, key", config._ABSOLUTE_PATHS)
def test_every_path_on_the_node_is_absolute_when_loaded(table: str, key: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused when the file is read, before any command does anything (a relative log_dir
    was refused only once a restore had downloaded and unpacked its checkpoint)."""
    value = '["logs"]' if isinstance(config._SCHEMA[table][key][1], list) else '"logs"'
    path = tmp_path / "config.toml"
    path.write_text(f"[{table}]\n{key} = {value}\n")
    monkeypatch.setenv("TORPOR_CONFIG", str(path))
    with pytest.raises(ConfigError, match=rf"\[{table}\] {key} = 'logs' is not an absolute path"):
        config.load()
    path.write_text(f"[{table}]\n{key} = {value.replace('logs', '/var/logs')}\n")
    assert "/var/logs" in str(getattr(config.load(), f"{table}_{key}"))
