"""`infcl-ds` dispatch: a group word (bench, data) alone or with --help lists its subcommands;
an unknown subcommand of a group is one line naming the valid ones; the benchmarks run from the
checkout (tests/test_resources.py: an installed wheel has none and says so)."""
import os
import subprocess
import sys

import pytest

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
