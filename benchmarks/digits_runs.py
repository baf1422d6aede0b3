"""One training run of the quickstart's recipe (ds_configs/recipes/tiny-cpu.yaml: a tiny CLIP on
scikit-learn's digits) on this machine's first GPU, as a subprocess with its own port: what the
benchmarks that ask "does setting X change what a model learns" share (`bench decoders`,
`bench float8`). The zero-shot top-1 on the held-out digits (decoded by PIL), the wall time and
the loss of every step (the run's metrics.csv)."""
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

from .common import free_port

RECIPE = Path(__file__).resolve().parents[1] / "ds_configs" / "recipes" / "tiny-cpu.yaml"


def recipe_command(digits: Path, run_dir: Path, steps: int, sets: Sequence[str]) -> List[str]:
    base = [f"output_dir={run_dir}", f"data.train={digits / 'train'}", f"data.eval={digits / 'test'}",
            f"schedule.steps={steps}", f"schedule.warmup_steps={min(20, steps)}", f"eval.every={steps}",
            f"checkpoint.every={steps}", "logging.tensorboard=false", "logging.progress=false"]
    command = [sys.executable, "-m", "infcl_ds.train", "--config", str(RECIPE)]
    for item in [*base, *sets]:
        command += ["--set", item]
    return command


def start_run(digits: Path, run_dir: Path, steps: int, sets: Sequence[str]) -> subprocess.Popen:
    """A single-rank run in the background (runs on one GPU can share it: each has its own port)."""
    env = {**os.environ, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "stderr.log", "w")
    process = subprocess.Popen(recipe_command(digits, run_dir, steps, sets), stdout=subprocess.DEVNULL, stderr=log,
                               text=True, env=env)
    process.started, process.log = time.perf_counter(), log  # noqa: B010 (read back by finish_run)
    return process


def finish_run(process: subprocess.Popen, run_dir: Path, what: str) -> Dict:
    """Wait for `process`; its zero-shot top-1, wall time and per-step losses (SystemExit naming
    `what` with the end of its log if it failed)."""
    code = process.wait()
    seconds = time.perf_counter() - process.started
    process.log.close()
    if code != 0:
        raise SystemExit(f"training with {what} failed:\n{(run_dir / 'stderr.log').read_text()[-3000:]}")
    with open(run_dir / "metrics.csv", newline="") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f)]
    results = json.loads((run_dir / "eval.json").read_text())
    return {"zeroshot_top1": results["zeroshot_top1"], "train_s": seconds, "losses": losses}


def train_digits(digits: Path, run_dir: Path, steps: int, sets: Sequence[str], what: str) -> Dict:
    """One run, waited for."""
    return finish_run(start_run(digits, run_dir, steps, sets), run_dir, what)
