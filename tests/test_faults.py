"""The fault matrix's machinery (benchmarks/faults.py, docs/reliability.md) on two gloo ranks
through launch/train.sh, for the two faults during a save that no other test delivers: a rank
SIGKILLed (the surviving rank 0 removes the unfinished tag, and its line names the rank that
exited) and SIGINT to the launcher (the save completes, every rank stops); and a rank stopped
during a step, named by rank 0 while the job waits (training/stopped_rank_watch.py). SIGTERM to
the launcher during training is test_launcher_signals.py's; a stopped peer of ranks started
without launch.py, test_reliability.py's."""
import json

import pytest

from launch_utils import ROOT
from test_launch import environment

from benchmarks import faults


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["kill-rank", "int-launcher"])
def test_a_fault_during_a_save_ends_the_job_and_leaves_a_resumable_run(tmp_path, scenario):
    row = faults.run_scenario(scenario, "save", tmp_path, accelerator="cpu", timeout_min=1, env=environment())
    context = {key: row.get(key) for key in ("error", "at_signal", "line", "latest", "partial_tags_after_fault",
                                             "resume_log_tail", "log")}
    assert "error" not in row and "being written" in row["at_signal"], context
    # Neither waits for the timeout: a dead peer's socket closes, the launcher's watch polls every second.
    assert row["seconds_to_gone"] is not None and row["seconds_to_gone"] < 30, row["seconds_to_gone"]
    assert row["latest"].startswith("step_"), context  # its manifest verified
    assert row["partial_tags_after_fault"] == [] and row["partial_tags"] == [], context
    assert row["resumed"], context  # one step past latest through train.sh --resume latest
    if scenario == "kill-rank":
        assert row["line"].startswith("infcl-ds train: rank 0, ") and "a collective failed" in row["line"], context
        assert "(timeout 1 min): rank 1 has exited, see its log." in row["line"], context
    else:
        # the rank that saw its launcher go first names its pid, the other "another rank's deepspeed launcher"
        assert "deepspeed launcher" in row["line"] and row["line"].endswith(": stopping"), context
    assert row["passed"], context


@pytest.mark.slow
def test_a_stopped_rank_is_named_while_the_job_waits_on_it(tmp_path):
    row = faults.run_scenario("stop-rank", "step", tmp_path, accelerator="cpu", timeout_min=0.5, env=environment())
    context = {key: row.get(key) for key in ("error", "at_signal", "line", "latest", "seconds_to_gone", "log")}
    assert "error" not in row, context
    assert row["line"].startswith("infcl-ds train: rank 0, step ") and ": rank 1 (pid " in row["line"], context
    assert "is stopped (SIGSTOP, or a suspended process)" in row["line"], context
    assert row["seconds_to_gone"] is not None and row["seconds_to_gone"] < 30 + 60, context
    assert row["passed"], context


def test_the_line_is_the_trainers_before_the_launchers():
    log = ("[2026-01-01 00:00:00,000] [ERROR] [launch.py:259:sigkill_handler] ['python', '-u', '-m', "
           "'infcl_ds.train', '--local_rank=1'] exits with return code = -9\n"
           "[rank0]: Traceback (most recent call last):\n"
           "infcl-ds train: rank 0, step 7: a collective failed or timed out (timeout 1 min): a peer rank is stopped\n")
    assert faults.cause_line(log).startswith("infcl-ds train: rank 0, step 7: ")
    only_launcher = log.splitlines()[0]
    assert faults.cause_line(only_launcher).endswith("exits with return code = -9")
    assert faults.names_a_rank(faults.cause_line(only_launcher))
    assert faults.cause_line("nothing here\n") is None and not faults.names_a_rank(None)


@pytest.mark.parametrize("name", ["faults.json", "faults_4ranks.json"])
def test_the_reliability_tables_are_the_matrices_measured(name):
    """docs/reliability.md's fault tables are `--table` of the JSON files, row for row."""
    rows = json.loads((ROOT / "docs" / "benchmarks" / name).read_text())["rows"]
    assert len(rows) == 8 and all(row["passed"] for row in rows)
    assert faults.markdown_table(rows) in (ROOT / "docs" / "reliability.md").read_text()


def test_only_names_known_scenarios():
    assert faults.selected("kill-rank:save,stop-rank:step") == [("kill-rank", "save"), ("stop-rank", "step")]
    assert len(faults.selected(None)) == 8
    with pytest.raises(SystemExit, match="unknown scenario kill-rank:eval"):
        faults.selected("kill-rank:eval")


def test_a_job_of_four_ranks_and_a_rank_outside_it_refused(tmp_path, capsys):
    command = faults.train_command(tmp_path / "run", [], ranks=4)
    assert command[command.index("--num_gpus") + 1] == "4"
    resumed = faults.train_command(tmp_path / "run", [], resume=True, ranks=4)
    assert resumed[-2:] == ["--resume", "latest"] and resumed[resumed.index("--num_gpus") + 1] == "4"
    with pytest.raises(SystemExit):
        faults.main(["--ranks", "2", "--rank", "3", "--out", str(tmp_path / "f.json")])
    assert "--rank must be one of the job's ranks, 0 to 1, got 3" in capsys.readouterr().err
