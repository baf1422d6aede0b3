"""`infcl-ds` dispatch: a group word (bench, data) alone or with --help lists its subcommands;
an unknown subcommand of a group is one line naming the valid ones; the benchmarks run from the
checkout (tests/test_resources.py: an installed wheel has none and says so)."""
import argparse
import os
import subprocess
import sys

import pytest

from cli_parsers import parsers_run
from infcl_ds.cli import COMMANDS, main

GROUPS = {"bench": ["loss", "ring", "train", "data"], "data": ["digits", "check", "photos"]}


@pytest.mark.parametrize("argv", [["bench", "--help"], ["bench", "-h"], ["bench"], ["data", "--help"], ["data"]],
                         ids=" ".join)
def test_a_group_word_lists_its_subcommands_with_their_help(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    group = argv[0]
    assert out.startswith(f"usage: infcl-ds {group} <command> [args]")
    for sub in GROUPS[group]:
        help_ = COMMANDS[f"{group} {sub}"][2]
        assert any(line.split() == [sub, *help_.split()] for line in out.splitlines()), (sub, out)


def test_an_unknown_subcommand_of_a_group_names_the_valid_ones(capsys):
    assert main(["bench", "lose", "--help"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == ("infcl-ds: unknown bench command 'lose'; bench commands: loss, ring, train, data, decoders, float8 "
                                    "(infcl-ds bench --help)")


def test_an_unknown_command_is_still_refused_with_the_usage(capsys):
    assert main(["bnech", "loss"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("infcl-ds: unknown command 'bnech loss'") and "commands:" in err


def test_bench_runs_the_checkouts_benchmarks_from_any_directory(tmp_path):
    """`benchmarks/` is not installed: from another directory (nothing on PYTHONPATH), the CLI
    finds it beside the package it was installed from (editable)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "infcl_ds.cli", "bench", "loss", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: infcl-ds bench loss"), done.stdout


def parsers_of(name: str, monkeypatch) -> list:
    """Every parser of ``infcl-ds NAME``: a dispatching parser without -h (``bench loss``'s
    ``--loss``) is followed into each of its choices' own parser."""
    seen = parsers_run([*name.split(), "--help"], monkeypatch)
    for dispatcher in [parser for parser in seen if not parser.add_help]:
        for action in dispatcher._actions:
            for choice in action.choices or ():
                seen += parsers_run([*name.split(), action.option_strings[0], choice, "--help"], monkeypatch)
    return seen


# Commands whose modules still have options without help (strict: the mark goes once they have it).
@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_of_every_command_has_help(name, monkeypatch):
    parsers = parsers_of(name, monkeypatch)
    assert any(parser.add_help for parser in parsers), f"infcl-ds {name} parsed nothing with -h"
    missing = sorted({f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
                      for parser in parsers for action in parser._actions
                      if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()})
    assert not missing, f"options without help: {missing}"
