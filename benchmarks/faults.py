"""`python -m benchmarks.faults`: the fault matrix of a job started by launch/train.sh.

    python -m benchmarks.faults --out docs/benchmarks/faults.json [--accelerator cuda|cpu]
        [--timeout-min 1] [--only kill-rank:step,term-launcher:save] [--ranks 2] [--rank 1] [--work DIR]
    python -m benchmarks.faults --table docs/benchmarks/faults.json   # its table in docs/reliability.md

Four faults, each delivered once during a step and once during a checkpoint save:
kill-rank (SIGKILL to one rank), stop-rank (SIGSTOP to one rank), term-launcher and
int-launcher (SIGTERM, SIGINT to the launcher: train.sh's pid, which execs DeepSpeed's runner).

Each scenario starts `launch/train.sh` with the tiny recipe on synthetic data on `--ranks` ranks
(two by default; NCCL on GPUs, one each, gloo on CPUs), in its own process session, with `distributed.timeout` at
``--timeout-min``. Once a checkpoint is complete (something to resume) it waits for the
phase, polling the run directory: "step", a checkpoint every 4 steps and the last logged step
one or two past a multiple of 4 (the step under way saves nothing); "save", a checkpoint
every step and a tag directory that ``latest`` does not name yet (rank 0 moves ``latest``
last). Then it sends the signal and measures: the seconds until no process of the session is
left, the launcher's exit status, the first line of the log that names a rank and the cause,
the tag ``latest`` names (its manifest verified), the tags whose manifest does not verify
(partial), right after and again after resuming: `train.sh ... --resume latest`, stopped by
SIGTERM to its launcher once it has logged one step past the checkpoint. A row passes when
everything was gone within the timeout plus 60 s, the line is there, ``latest`` verified, the
resume trained its step and no partial tag was left.
"""
import argparse
import csv
import json
import io
import os
import re
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from .common import Job, free_port, job_environment, run_identity, write_rows

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "ds_configs" / "recipes" / "tiny-cpu.yaml"
# The tiny model on synthetic data: seconds per step on two CPU cores; a save of it is about a
# fifth of a step there.
SETTINGS = ["model.name=infcl-tiny", "data.source=synthetic", "data.synthetic_size=64", "data.eval=null",
            "data.workers=0", "batch.global=16", "batch.chunk=4", "schedule.warmup_steps=1",
            "schedule.steps=100000", "checkpoint.keep=2", "logging.progress=false", "logging.tensorboard=false",
            "eval.every=0"]
SCENARIOS = {"kill-rank": (signal.SIGKILL, "rank"), "stop-rank": (signal.SIGSTOP, "rank"),
             "term-launcher": (signal.SIGTERM, "launcher"), "int-launcher": (signal.SIGINT, "launcher")}
PHASES = ("step", "save")
STEP_CADENCE = 4  # checkpoint.every of a "step" scenario: room for a step that saves nothing
OVER_TIMEOUT_S = 60  # the budget: every process gone within distributed.timeout plus this
START_S = 600  # to the first complete checkpoint: a cold start may build DeepSpeed's ops
RESUME_STOP_S = 60  # a resumed job stopped through its launcher ends within the watch's grace


# -- the job ---------------------------------------------------------------------------------

def train_command(run_dir: Path, sets: List[str], resume: bool = False, ranks: int = 2) -> List[str]:
    sets = SETTINGS + [f"output_dir={run_dir}"] + sets
    return (["launch/train.sh", str(RECIPE.relative_to(ROOT)), "--num_gpus", str(ranks), "--no-plan", "--master_port",
             str(free_port())] + [a for s in sets for a in ("--set", s)] + (["--resume", "latest"] if resume else []))


# -- the run directory -----------------------------------------------------------------------

def logged_steps(run_dir: Path) -> List[str]:
    """metrics.csv's rows as lines (rank 0 appends one per step)."""
    try:
        text = (run_dir / "metrics.csv").read_text()
    except OSError:
        return []
    return text.splitlines()[1:]


def step_of(line: str) -> int:
    return int(next(csv.reader(io.StringIO(line)))[0])


def latest_step(run_dir: Path) -> Optional[int]:
    from infcl_ds.checkpoint.tags import read_latest
    name = read_latest(run_dir / "checkpoints")
    return int(name.split("_")[1]) if name and re.fullmatch(r"step_\d+", name) else None


def saving(run_dir: Path) -> Optional[str]:
    """The tag being written: a tag directory newer than the one ``latest`` names."""
    latest = latest_step(run_dir) or 0
    try:
        names = os.listdir(run_dir / "checkpoints")
    except OSError:
        return None
    newer = [n for n in names if re.fullmatch(r"step_\d+", n) and int(n.split("_")[1]) > latest]
    return max(newer) if newer else None


def latest_verified(run_dir: Path) -> str:
    """The tag ``latest`` names once its manifest verified, or why not."""
    from infcl_ds.checkpoint.safe_load import CheckpointError
    from infcl_ds.checkpoint.tags import resolve_tag
    try:
        return resolve_tag(run_dir / "checkpoints").name  # not the run's owner: it removes nothing
    except CheckpointError as err:
        return f"refused: {err}"


def partial_tags(run_dir: Path) -> List[str]:
    """Tag directories whose manifest does not verify (missing, damaged or not matching)."""
    from infcl_ds.checkpoint.manifest import verify
    from infcl_ds.checkpoint.safe_load import CheckpointError
    found = []
    for tag_dir in sorted((run_dir / "checkpoints").glob("step_*")):
        try:
            verify(tag_dir)
        except CheckpointError:
            found.append(tag_dir.name)
    return found


def wait_for_phase(job: Job, run_dir: Path, phase: str) -> str:
    """Return once the job is in ``phase`` (after a first complete checkpoint), saying where it is."""
    deadline = time.monotonic() + START_S
    while True:
        if job.proc.poll() is not None:
            raise RuntimeError(f"the job ended before the fault (status {job.proc.returncode}):\n{job.text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {phase} phase within {START_S} s:\n{job.text()[-3000:]}")
        latest, tag = latest_step(run_dir), saving(run_dir)
        if latest is not None and phase == "save" and tag is not None:
            return f"{tag} being written (latest step_{latest:08d})"
        rows = logged_steps(run_dir)
        if latest is not None and phase == "step" and tag is None and rows:
            done = step_of(rows[-1])
            if done % STEP_CADENCE in (1, 2):  # the step under way, done + 1, saves nothing
                return f"step {done + 1} under way (latest step_{latest:08d})"
        time.sleep(0.002 if phase == "save" else 0.02)  # a tiny model's save lasts tens of ms


# -- what the log says -----------------------------------------------------------------------

# Lines naming a rank and why it stops, best first: the trainer's own (a failed collective,
# the launcher gone), NCCL's watchdog (a timeout that tears the process down), DeepSpeed's
# launch.py (a rank's exit status; it names the last rank's command line, whichever failed).
CAUSE_LINES = (re.compile(r"infcl-ds train: rank \S+, .*"),
               re.compile(r".*\[Rank \d+\].*(Watchdog caught collective operation timeout|timed out|Timeout).*"),
               re.compile(r".*--local_rank=\d+.* exits with return code = -?\d+.*"))


def cause_line(text: str) -> Optional[str]:
    for pattern in CAUSE_LINES:
        for line in text.splitlines():
            found = pattern.search(line)
            if found:
                return found.group(0).strip()
    return None


def names_a_rank(line: Optional[str]) -> bool:
    return line is not None and re.search(r"rank[ =]?\d+", line, re.IGNORECASE) is not None


# -- one scenario ----------------------------------------------------------------------------

def resume_one_step(run_dir: Path, sets: List[str], env: Dict[str, str], log: Path, ranks: int = 2) -> dict:
    """Resume the run through train.sh, wait for one new logged step past ``latest``, then stop
    it through its launcher (no checkpoint of its own: what it leaves is the fault's)."""
    before, latest = set(logged_steps(run_dir)), latest_step(run_dir)
    job = Job(train_command(run_dir, sets + ["checkpoint.every=0"], resume=True, ranks=ranks), env, log)
    result = {"resumed": False, "resumed_step": None, "resume_command": shlex.join(job.command)}
    try:
        deadline = time.monotonic() + START_S
        while job.proc.poll() is None and time.monotonic() < deadline:
            new = [step_of(line) for line in logged_steps(run_dir) if line not in before]
            if new:
                result["resumed_step"] = new[0]
                break
            time.sleep(0.1)
        if result["resumed_step"] is not None:
            os.kill(job.proc.pid, signal.SIGTERM)
            result["resume_stopped_s"] = job.wait_gone(RESUME_STOP_S, time.monotonic())
        result["resumed"] = (latest is not None and result["resumed_step"] == latest + 1
                             and result.get("resume_stopped_s") is not None)
        text = job.text()
        result["cleanup"] = next((line for line in text.splitlines() if "unfinished checkpoint tag" in line), None)
        if not result["resumed"]:
            result["resume_log_tail"] = text[-3000:]
    finally:
        if job.processes():
            job.kill()
    return result


def run_scenario(scenario: str, phase: str, work: Path, accelerator: str = "cpu", timeout_min: float = 1.0,
                 rank: int = 1, env: Optional[Dict[str, str]] = None, ranks: int = 2) -> dict:
    """One row of the matrix: start a job of ``ranks`` ranks, wait for ``phase``, deliver
    ``scenario``'s signal, measure, resume."""
    sig, target = SCENARIOS[scenario]
    env = env if env is not None else job_environment(accelerator)
    case = work / f"{scenario}-{phase}"
    case.mkdir(parents=True, exist_ok=False)
    run_dir = case / "run"
    sets = [f"distributed.timeout={timeout_min:g}",
            f"checkpoint.every={1 if phase == 'save' else STEP_CADENCE}"]
    timeout_s, began = 60.0 * timeout_min, time.monotonic()
    job = Job(train_command(run_dir, sets, ranks=ranks), env, case / "fault.log")
    row = {"scenario": scenario, "phase": phase, "signal": signal.Signals(sig).name,
           "backend": "gloo" if accelerator == "cpu" else "nccl", "world": ranks, "timeout_s": timeout_s,
           "budget_s": timeout_s + OVER_TIMEOUT_S, "command": shlex.join(job.command), "log": str(case / "fault.log")}
    try:
        try:
            wait_for_phase(job, run_dir, "step")  # the ranks are up and a checkpoint is complete
            pid = job.rank(rank) if target == "rank" else job.proc.pid
            if pid is None:
                raise RuntimeError(f"no process of rank {rank} in the job")
            row["at_signal"] = wait_for_phase(job, run_dir, phase)
        except RuntimeError as err:  # the job failed on its own: nothing to measure
            job.kill()
            return {**row, "error": str(err), "passed": False}
        os.kill(pid, sig)
        sent = time.monotonic()
        row["target"] = f"rank {rank} (pid {pid})" if target == "rank" else f"launcher (pid {pid})"
        gone = job.wait_gone(timeout_s + OVER_TIMEOUT_S + 60, sent)  # past the budget too: how far past
        if gone is None:
            job.kill()
        row.update(seconds_to_gone=None if gone is None else round(gone, 1),
                   within_budget=gone is not None and gone <= timeout_s + OVER_TIMEOUT_S,
                   launcher_status=job.proc.returncode)
    except BaseException:
        job.kill()
        raise
    row["line"] = cause_line(job.text())
    row["latest"] = latest_verified(run_dir)
    row["partial_tags_after_fault"] = partial_tags(run_dir)
    row.update(resume_one_step(run_dir, sets, env, case / "resume.log", ranks))
    row["partial_tags"] = partial_tags(run_dir)
    row["scenario_s"] = round(time.monotonic() - began, 1)
    row["passed"] = (row["within_budget"] and names_a_rank(row["line"]) and not row["latest"].startswith("refused")
                     and row["resumed"] and not row["partial_tags"])
    return row


# -- the matrix ------------------------------------------------------------------------------

def selected(only: Optional[str]) -> List[tuple]:
    everything = [(s, p) for s in SCENARIOS for p in PHASES]
    if not only:
        return everything
    wanted = [tuple(item.split(":")) for item in only.split(",") if item]
    unknown = [":".join(w) for w in wanted if w not in everything]
    if unknown:
        raise SystemExit(f"--only: unknown scenario {', '.join(unknown)}; known: "
                         f"{', '.join(':'.join(e) for e in everything)}")
    return wanted


def summary(row: dict) -> str:
    head = f"{row['scenario']}:{row['phase']}: "
    if "error" in row:
        return head + f"FAILED before the fault: {row['error']}"
    return (head + f"gone in {row['seconds_to_gone']} s (budget {row['budget_s']:g}), latest {row['latest']}, "
            f"partial {row['partial_tags_after_fault']} then {row['partial_tags']}, resumed {row['resumed']}: "
            f"{'passed' if row['passed'] else 'FAILED'}\n  {row['line']}")


LINE_CHARS = 190  # the line, cut for a table cell


def markdown_table(rows: List[dict]) -> str:
    """docs/reliability.md's table of a fault matrix's rows (one per JSON row)."""
    def who(row):
        target = row.get("target", "")
        return target.split(" (pid")[0] if target.startswith("rank") else "launcher"

    def line(row):
        text = row.get("line") or "none"
        return f"`{text[:LINE_CHARS]} [...]`" if len(text) > LINE_CHARS else f"`{text}`"

    def tags(found):
        return ", ".join(found) or "none"

    out = ["| Fault | Phase | At the signal | Gone (s) | Launcher exit | The line | `latest` after | Partial tags: "
           "after the fault / after the resume | Resume trained step |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            out.append(f"| {row['signal']} {who(row)} | {row['phase']} | failed before the fault: {row['error']} "
                       "| | | | | | |")
            continue
        out.append(f"| {row['signal']} {who(row)} | {row['phase']} | {row['at_signal']} | {row['seconds_to_gone']} | "
                   f"{row['launcher_status']} | {line(row)} | {row['latest']} | "
                   f"{tags(row['partial_tags_after_fault'])} / {tags(row['partial_tags'])} | {row['resumed_step']} |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.faults", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks/faults.json"))
    p.add_argument("--accelerator", choices=("cuda", "cpu"), default=None,
                   help="cuda (NCCL, one GPU per rank) or cpu (gloo); default: cuda where there is one")
    p.add_argument("--timeout-min", type=float, default=1.0, help="the job's distributed.timeout, minutes")
    p.add_argument("--only", default=None, help="scenarios, e.g. kill-rank:step,term-launcher:save (default: all 8)")
    p.add_argument("--ranks", type=int, default=2, choices=(2, 4), help="ranks of the job (GPUs on CUDA)")
    p.add_argument("--rank", type=int, default=1, help="the rank that kill-rank and stop-rank hit")
    p.add_argument("--table", type=Path, default=None, metavar="JSON",
                   help="print the markdown table of a matrix already run (docs/reliability.md) and stop")
    p.add_argument("--work", type=Path, default=None,
                   help="where the runs and logs go (default: a new temporary folder)")
    args = p.parse_args(argv)
    if args.table is not None:
        print(markdown_table(json.loads(args.table.read_text())["rows"]))
        return []
    if not 0 <= args.rank < args.ranks:
        p.error(f"--rank must be one of the job's ranks, 0 to {args.ranks - 1}, got {args.rank}")
    import torch
    accelerator = args.accelerator or ("cuda" if torch.cuda.is_available() else "cpu")
    work = args.work or Path(tempfile.mkdtemp(prefix="infcl-ds-faults-"))
    arguments = argv if argv is not None else sys.argv[1:]
    meta = {**run_identity(), "command": "python -m benchmarks.faults " + shlex.join(arguments), "work": str(work)}
    rows = []
    for scenario, phase in selected(args.only):
        row = run_scenario(scenario, phase, work, accelerator, args.timeout_min, args.rank, ranks=args.ranks)
        rows.append({**row, "commit": meta["commit"], "device": meta["device"]})
        write_rows(args.out, rows, meta)  # after each: a cut-short matrix keeps what it measured
        print(summary(row), flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(0 if all(r["passed"] for r in main()) else 1)
