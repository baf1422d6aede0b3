"""A run directory belongs to one run: a second start without --resume is refused (exit 2, one
line, the first run's files untouched), --restart moves the old run to OUTPUT_DIR.old-<UTC
time> and starts a fresh one there (checkpoint.keep holds), --resume still continues it, and
launch/train.sh passes --restart to the trainer. One rank of the tiny recipe on synthetic data."""
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dist_utils import run_ranks
from infcl_ds.run_dir import LOCK_FILE
from launch_utils import ROOT, SYNTHETIC, TINY, start_ranks, wait_all

FIRST = ["schedule.steps=3", "checkpoint.every=1", "checkpoint.keep=2", "logging.tensorboard=true"]
REFUSED = "already holds a run"


def _files(run_dir: Path) -> dict:
    """Every file of the run under run_dir with its bytes: what must stay byte-identical. Not
    the directory's lock file: each start notes itself there (training/run_lock.py)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """A finished 3-step run (checkpoints every step, keep 2, TensorBoard on), copied per test."""
    base = tmp_path_factory.mktemp("first")
    run = base / "run"
    assert wait_all(start_ranks(1, FIRST + [f"output_dir={run}"], log_dir=base)) == [0]
    return run


@pytest.fixture
def run_dir(first_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(first_run, run)
    return run


def _train(tmp_path, run, overrides=(), extra=(), log="again.log"):
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    code = wait_all(start_ranks(1, list(overrides) + [f"output_dir={run}"], list(extra), log_dir=logs))[0]
    text = (logs / "rank0.log").read_text()
    (logs / "rank0.log").rename(logs / log)
    return code, text


def test_second_start_without_resume_is_refused(tmp_path, run_dir):
    before = _files(run_dir)
    assert "checkpoints/latest" in before and "metrics.csv" in before
    code, log = _train(tmp_path, run_dir, ["schedule.steps=2"])
    assert code == 2
    lines = [line for line in log.splitlines() if REFUSED in line]
    assert lines == [f"infcl-ds train: output_dir {run_dir} already holds a run (checkpoints/latest): pass --resume "
                     f"latest to continue it, or --restart to move it to {run_dir}.old-<UTC time> and start over"]
    assert "Traceback" not in log
    assert _files(run_dir) == before


def test_metrics_alone_hold_a_run(tmp_path):
    # A run killed before its first checkpoint has rows in metrics.csv that a start would cut.
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text("step,loss\n1,2.0\n")
    code, log = _train(tmp_path, run, ["schedule.steps=1"])
    assert code == 2 and f"output_dir {run} already holds a run (metrics.csv)" in log
    assert (run / "metrics.csv").read_text() == "step,loss\n1,2.0\n"


def test_restart_moves_the_old_run_aside(tmp_path, run_dir):
    before = _files(run_dir)
    (run_dir / "job.log").write_text("a job script's own log")  # not the trainer's: stays
    code, log = _train(tmp_path, run_dir, ["schedule.steps=2", "checkpoint.every=1", "checkpoint.keep=1"],
                       ["--restart"])
    assert code == 0, log
    old = list(tmp_path.glob("run.old-*"))
    assert len(old) == 1 and old[0].name[len("run.old-"):].endswith("Z")
    assert f"infcl-ds train: --restart: moved the previous run of {run_dir} to {old[0]}" in log
    assert _files(old[0]) == before  # all of it, byte for byte
    # The new run alone: its own tags within keep, its own latest, its two metric rows.
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_00000002"]
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_00000002"
    assert [row.split(",")[0] for row in (run_dir / "metrics.csv").read_text().splitlines()[1:]] == ["1", "2"]
    assert (run_dir / "job.log").read_text() == "a job script's own log"
    assert not (run_dir / "tensorboard").exists()  # the old events moved; this run has TensorBoard off


def test_resume_still_continues_the_run(tmp_path, run_dir):
    code, log = _train(tmp_path, run_dir, FIRST, ["--resume", "step_00000002"])
    assert code == 0, log
    assert REFUSED not in log and "Traceback" not in log and not list(tmp_path.glob("run.old-*"))
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_00000003"
    # The metrics read as one run: the resumed step 3 replaces the first run's.
    assert [row.split(",")[0] for row in (run_dir / "metrics.csv").read_text().splitlines()[1:]] == ["1", "2", "3"]


def _plain_then_restart(rank, world, run_dir):
    """On every rank: a plain start (refused alike), then --restart (rank 0 moves, all train)."""
    from infcl_ds.config import load_recipe
    from infcl_ds.training.trainer import Trainer
    from infcl_ds.training.preflight import StartupError
    recipe = load_recipe(TINY, SYNTHETIC + ["schedule.steps=2", "checkpoint.every=1", "checkpoint.keep=1",
                                            f"output_dir={run_dir}"])
    out = {}
    try:
        Trainer(recipe)
        out["plain"] = "started"
    except StartupError as err:
        out["plain"] = str(err)
    import deepspeed.comm as dist
    dist.barrier()  # two starts in one test: no rank restarts while a peer still checks the first
    Trainer(recipe, restart=True).run()
    return out


def test_two_ranks_refuse_alike_and_restart_together(tmp_path, run_dir):
    before = _files(run_dir)
    results = run_ranks(_plain_then_restart, 2, str(run_dir), wait_s=400)
    for rank in range(2):
        assert results[rank]["plain"].startswith(f"output_dir {run_dir} already holds a run"), results[rank]
    old = list(tmp_path.glob("run.old-*"))
    assert len(old) == 1 and _files(old[0]) == before
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_00000002"]
    assert sorted(p.name for p in (run_dir / "checkpoints" / "step_00000002").glob("client_rank*.pt")) == [
        "client_rank0.pt", "client_rank1.pt"]


def test_restart_and_resume_exclude_each_other(capsys):
    from infcl_ds.train import main
    assert main(["--config", str(TINY), "--restart", "--resume", "latest"]) == 2
    assert "--restart starts over and --resume continues a run: give one of them" in capsys.readouterr().err


def test_train_sh_passes_restart_to_the_trainer(tmp_path):
    # A stand-in `deepspeed` on PATH records the command line train.sh would launch.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "deepspeed"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    sets = [arg for s in SYNTHETIC for arg in ("--set", s)]
    # An active environment (this interpreter's): else train.sh puts the checkout's .venv/bin,
    # whose real deepspeed would win over the stand-in, first on PATH.
    env = dict(os.environ, PATH=f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
               DS_ACCELERATOR="cpu", VIRTUAL_ENV=sys.prefix)
    proc = subprocess.run([str(ROOT / "launch" / "train.sh"), str(TINY), "--num_gpus", "1", "--no-plan", *sets,
                           "--restart"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[-1] == "--restart" and "infcl_ds.train" in argv
