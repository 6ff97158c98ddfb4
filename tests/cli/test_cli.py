"""The `stallscope` command's shape: an explicit command table, examples at
the end of every --help, daemon flags generated from the declared config
keys, and expected failures printed as `error: ...` with exit status 2."""

import argparse
import subprocess
import sys

import pytest

from stallscope import cli
from stallscope.errors import AccessError, StallscopeError
from stallscope.service import config


def _subparsers(parser):
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def test_the_command_table_is_the_parser():
    assert list(_subparsers(cli.build_parser())) == list(cli.COMMANDS)
    assert set(cli.COMMANDS) == {
        "daemon", "run", "demo", "query", "report", "compare", "top", "status", "deep", "export",
        "profile", "stacks",
    }  # fmt: skip


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_help_ends_with_examples(name, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([name, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    head, _, tail = text.rpartition("\nexamples:\n")
    examples = tail.strip().splitlines()
    assert head and 2 <= len(examples) <= 3, text
    assert all(line.strip().startswith(f"stallscope {name}") for line in examples), examples


def test_examples_parse():
    # An example that no longer parses would teach a wrong command line.
    parser = cli.build_parser()
    for name, command in cli.COMMANDS.items():
        for line in command.examples:
            # a comment, or a pipe into another tool, ends our command line
            line = line.split("#", 1)[0].split(" | ", 1)[0]
            words = line.split()
            if '"' in line:  # a quoted SQL argument: one word
                before, quoted, _ = line.split('"', 2)
                words = before.split() + [quoted]
            args = parser.parse_args(words[1:])
            assert args.command == name


def test_daemon_flags_are_the_declared_keys():
    flags = _subparsers(cli.build_parser())["daemon"]
    dests = {a.dest for a in flags._actions} - {"help", "config"}
    assert dests == {k.flag for k in config.KEYS if k.flag}
    args = flags.parse_args(["--gpus", "0,1", "--pid", "7", "--pid", "8,9"])
    cfg = config.resolve(vars(args), None, {})
    assert cfg["probes.gpus"] == [0, 1] and cfg["daemon.pids"] == [7, 8, 9]
    args = flags.parse_args(["--retention-interval-s", "5"])
    assert config.resolve(vars(args), None, {})["retention.check_interval_s"] == 5.0


def test_a_library_error_becomes_one_line_and_status_2(tmp_path, capsys):
    rc = cli.main(["query", "runs", "--db", str(tmp_path / "absent.duckdb")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: no database at ") and err.count("\n") == 1


def test_a_refused_configuration_says_so(tmp_path, capsys):
    rc = cli.main(["daemon", "--config", str(tmp_path / "absent.toml")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: configuration refused: ") and "cannot read" in err


def test_the_error_hierarchy_has_one_base():
    assert issubclass(AccessError, StallscopeError)
    assert AccessError("x").user_message() == "x"
    assert config.ConfigError("y").user_message() == "configuration refused: y"


def test_python_dash_m_is_the_command():
    out = subprocess.run(
        [sys.executable, "-m", "stallscope.cli", "status", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "examples:" in out.stdout
