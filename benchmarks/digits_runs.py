"""Training runs of the quickstart's recipe (ds_configs/recipes/tiny-cpu.yaml: a tiny CLIP on
scikit-learn's digits) on this machine's first GPU, as subprocesses with their own ports: what the
benchmarks that ask "does setting X change what a model learns" share (`bench decoders`,
`bench float8`). Per run: the zero-shot top-1 on the held-out digits (decoded by PIL), its wall
time and the loss of every step (the run's metrics.csv)."""
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Hashable, List, Sequence, Tuple

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


def _results(run_dir: Path) -> Dict:
    with open(run_dir / "metrics.csv", newline="") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f)]
    return {"zeroshot_top1": json.loads((run_dir / "eval.json").read_text())["zeroshot_top1"], "losses": losses}


def train_digits_runs(digits: Path, steps: int, runs: Dict[Hashable, Tuple[Path, Sequence[str], str]]) -> Dict:
    """Run every `key: (run_dir, recipe sets, what)` at once, single-rank (runs of a tiny model
    share one GPU); {key: zero-shot top-1, wall time from its start to its own end, losses}. If
    one fails, the others are stopped and SystemExit names the run (`what`) with its log's end."""
    started, processes, logs, ended = time.perf_counter(), {}, {}, {}
    try:
        for key, (run_dir, sets, _) in runs.items():
            run_dir.mkdir(parents=True, exist_ok=True)
            logs[key] = open(run_dir / "stderr.log", "w")
            env = {**os.environ, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(free_port())}
            processes[key] = subprocess.Popen(recipe_command(digits, run_dir, steps, sets), stdout=subprocess.DEVNULL,
                                              stderr=logs[key], env=env)
        while len(ended) < len(processes):
            for key, process in processes.items():
                if key not in ended and process.poll() is not None:
                    ended[key] = time.perf_counter() - started
                    if process.returncode != 0:
                        run_dir, _, what = runs[key]
                        logs[key].close()
                        raise SystemExit(f"training with {what} failed:\n{(run_dir / 'stderr.log').read_text()[-3000:]}")
            time.sleep(0.5)
    finally:
        for key, process in processes.items():
            if process.poll() is None:
                process.terminate()
                process.wait()
        for log in logs.values():
            log.close()
    return {key: {**_results(runs[key][0]), "train_s": ended[key]} for key in runs}


def train_digits(digits: Path, run_dir: Path, steps: int, sets: Sequence[str], what: str) -> Dict:
    """One run, waited for."""
    return train_digits_runs(digits, steps, {0: (run_dir, sets, what)})[0]


def zeroshot_summary(rows: List[Dict], key: str, baseline: str, difference: str) -> Dict[str, Dict]:
    """Per value of `rows[i][key]`: the mean zero-shot top-1 over its runs, and under `difference`
    that mean less `baseline`'s (None where `baseline` did not run)."""
    values = list(dict.fromkeys(r[key] for r in rows))
    means = {v: statistics.mean(r["zeroshot_top1"] for r in rows if r[key] == v) for v in values}
    return {v: {"mean_zeroshot_top1": m, difference: m - means[baseline] if baseline in means else None}
            for v, m in means.items()}
