"""`torpor --help` lists every verb from one table, without importing any verb's module."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner

from torpor.cli.main import LAZY_COMMANDS, cli


def test_every_listed_verb_is_a_command_of_its_module() -> None:
    ctx = click.Context(cli)
    for name, (module, summary) in LAZY_COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None and command.name == name, (name, module)
        assert summary.endswith(".") and len(summary) <= 58, name  # one line in a terminal


def test_help_lists_every_verb_on_one_line() -> None:
    result = CliRunner().invoke(cli, ["--help"], terminal_width=80)
    assert result.exit_code == 0
    listed = result.output.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed if line.strip()] == sorted(LAZY_COMMANDS)


def test_help_imports_no_verb() -> None:
    code = ("import sys; from torpor.cli.main import main; sys.argv = ['torpor', '--help']\n"
            "try:\n    main()\nfinally:\n"
            "    print([m for m in sys.modules if m.endswith('_cmd') or m == 'grpc'],"
            " file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30)
    assert done.stderr.strip().splitlines()[-1] == "[]"
