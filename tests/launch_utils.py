"""Start `python -m infcl_ds.train` on N ranks of this machine (127.0.0.1), as a launcher would."""
import os
import subprocess
import sys
from pathlib import Path
from typing import List

from benchmarks.common import free_port

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "ds_configs" / "recipes" / "tiny-cpu.yaml"
# The tiny recipe on synthetic data: seconds per run on two cores.
SYNTHETIC = ["model.name=infcl-tiny", "data.source=synthetic", "data.synthetic_size=64", "data.eval=null",
             "data.workers=0", "batch.global=16", "batch.chunk=4", "schedule.warmup_steps=1",
             "logging.progress=false", "logging.tensorboard=false", "eval.every=0"]


# A two-step ZeRO-2 run on one rank, a checkpoint after each step: model states, optimizer
# states and client state files, two tags.
RUN_SETTINGS = ["zero.stage=2", "precision.dtype=fp32", "schedule.steps=2", "checkpoint.every=1",
                "checkpoint.keep=3"]


def run_recipe(run_dir, extra=()):
    """The tiny recipe on synthetic data, RUN_SETTINGS, writing to ``run_dir``, with ``extra`` overrides."""
    from infcl_ds.config import load_recipe
    return load_recipe(TINY, SYNTHETIC + RUN_SETTINGS + [f"output_dir={run_dir}"] + list(extra))


def start_ranks(world: int, overrides: List[str], extra: List[str] = (), log_dir: Path = None,
                accelerator: str = "cpu") -> List[subprocess.Popen]:
    port = free_port()
    args = [sys.executable, "-m", "infcl_ds.train", "--config", str(TINY)]
    for item in SYNTHETIC + list(overrides):
        args += ["--set", item]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), DS_ACCELERATOR=accelerator, OMP_NUM_THREADS="1")
        out = open(log_dir / f"rank{rank}.log", "ab") if log_dir else subprocess.DEVNULL
        procs.append(subprocess.Popen(args + list(extra), env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT))
    return procs


def wait_all(procs, timeout=300) -> List[int]:
    return [p.wait(timeout=timeout) for p in procs]


def data_check(capsys, *sets):
    """`infcl-ds data check` of the tiny recipe with `sets` (no eval split, a global batch of one
    sample, which the tests' few rows fill): (exit code, captured output)."""
    from infcl_ds.data.commands.check import main
    args = ["--config", str(TINY), "--set", "data.eval=null", "--set", "batch.global=1", "--set", "batch.chunk=1"]
    for item in sets:
        args += ["--set", item]
    code = main(args)
    return code, capsys.readouterr()
