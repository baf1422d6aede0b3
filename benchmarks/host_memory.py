"""`python -m benchmarks.host_memory`: a real training run's host memory, GPU memory and step
time against the planner's, per host form (encoded or decoded local batches).

    python -m benchmarks.host_memory --recipe R.yaml --steps 2 [--resume] --out docs/benchmarks/host_memory.json

The trainer runs as a child process (`infcl-ds train`, one process); a sampler records the host
memory the run takes every half second: the machine's memory in use above what it used before
the start (page cache excluded), and, in sweeps spaced to take at most SWEEP_DUTY of the run, the
summed resident memory of the trainer and its data and decode workers twice over: their resident memory summed (which counts pages shared between them
more than once) and their proportional set size summed (PSS: a shared page split between the
processes that map it, so the sum counts it once; the figure the planner's host model is
compared with, as it does not move with a VM's accounting of its own memory). Step time, peak GPU
memory and the time spent waiting on decoding come from the run's metrics.csv. A host form the
planner refuses is not run: its row carries the planner's line.
"""
import argparse
import csv
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from infcl_ds.plan.command import parse_size
from infcl_ds.plan.memory import GIB
from .common import run_identity, write_rows


# A PSS sweep reads every process's /proc/PID/smaps_rollup: the kernel walks the page tables of
# all it maps (hundreds of GiB of decode window and kept rows in a large run: seconds a sweep)
# holding that process's mmap lock, so the trainer's own mmap and munmap (glibc's large frees,
# pinned buffers), and the page faults queued behind them, wait. Sweeps are spaced to take at
# most this share of the run; the machine's memory in use is read every period, at no such cost.
SWEEP_DUTY = 0.03


# The machine's total memory may move this much (a rounding, a driver's reservation) and still count
# as a host whose memory-in-use figure holds.
TOTAL_STEADY_SHARE = 0.01


def peak_host(peak_used_gib: float, peak_pss_gib: float, timeline: list) -> tuple:
    """(GiB, which reading) of a run's peak host memory, the figure compared with the planner's.
    The tree's PSS counts only the run's processes, but it is read in sweeps spaced to SWEEP_DUTY:
    where one sweep takes a minute (hundreds of GiB mapped) the next is due after the run ends,
    and the sweeps miss the peak. The memory in use above the start is read every period and
    also holds what the run makes the kernel keep (page tables, page-locked buffers); it moves
    with anything else on the machine and, on a VM whose total grows as memory is first used,
    with that growth. So: the larger of the two where the machine's total stayed put, the PSS
    where it moved."""
    totals = [point[4] for point in timeline if len(point) > 4]
    if totals and max(totals) - min(totals) <= TOTAL_STEADY_SHARE * max(totals) and peak_used_gib > peak_pss_gib:
        return peak_used_gib, "in use"
    return peak_pss_gib, "pss"


class MemorySampler(threading.Thread):
    """Peak host memory of a process tree while it runs, and a timeline of it that says when a
    peak happened (at compilation, while the next batch is assembled, at a save): every
    `timeline_s`, [seconds since the start, then the largest since the previous point of: GiB
    in use above the baseline, the tree's resident GiB, the machine's shared memory (tmpfs: the
    data workers' pieces live there), the machine's total memory (on some VMs it grows as memory
    is first used, which moves the in-use figure), the tree's PSS GiB]."""

    def __init__(self, pid: int, period_s: float = 0.5, timeline_s: float = 5.0):
        import psutil
        super().__init__(daemon=True)
        self.psutil, self.pid, self.period_s, self.timeline_s = psutil, pid, period_s, timeline_s
        self.baseline = self._used()
        self.peak_used = self.peak_tree_rss = self.peak_tree_pss = 0
        self.timeline = []
        self.done = threading.Event()
        self.tree = (0, 0)               # the last sweep's (RSS, PSS)
        self.sweeps, self.sweep_s, self.sweep_max_s = 0, 0.0, 0.0
        self._next_sweep = 0.0

    def _used(self) -> int:
        vm = self.psutil.virtual_memory()
        return vm.total - vm.available

    def _tree(self) -> tuple:
        """(summed RSS, summed PSS) of the trainer and its children; a process that exits
        between the listing and the reading is left out."""
        try:
            root = self.psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except self.psutil.Error:
            return 0, 0
        rss = pss = 0
        for p in procs:
            try:
                full = p.memory_full_info()  # /proc/PID/smaps_rollup
                rss, pss = rss + full.rss, pss + full.pss
            except self.psutil.Error:
                pass
        return rss, pss

    def _alive(self) -> bool:
        try:
            return self.psutil.Process(self.pid).status() != self.psutil.STATUS_ZOMBIE
        except self.psutil.Error:
            return False

    def _sweep_due(self, now: float) -> bool:
        return now >= self._next_sweep

    def _sweep(self, now: float) -> None:
        """The tree's RSS and PSS, spaced so that sweeping takes at most SWEEP_DUTY of the time."""
        started = time.monotonic()
        self.tree = self._tree()
        took = time.monotonic() - started
        self.sweeps, self.sweep_s, self.sweep_max_s = self.sweeps + 1, self.sweep_s + took, max(self.sweep_max_s, took)
        self._next_sweep = now + took / SWEEP_DUTY

    def _sample(self) -> Optional[tuple]:
        """None once the tree is gone (its root has exited, before the caller sees it end): such
        a sample is not one of the run's."""
        if not self._alive():
            return None
        vm = self.psutil.virtual_memory()
        now = time.monotonic()
        if self._sweep_due(now):
            self._sweep(now)
        rss, pss = self.tree
        return vm.total - vm.available - self.baseline, rss, getattr(vm, "shared", 0), vm.total, pss

    def sweep_report(self, wall_s: float) -> dict:
        """How the PSS figure was sampled, for a row: sweeps, the longest, their share of the run."""
        return {"pss_sweeps": self.sweeps, "pss_sweep_max_s": round(self.sweep_max_s, 3),
                "pss_sweep_share": round(self.sweep_s / wall_s, 4) if wall_s > 0 else None}

    def _point(self, seconds: float, span: tuple) -> None:
        self.timeline.append([round(seconds, 1), *(round(v / GIB, 2) for v in span)])

    def run(self):
        start = last = now = time.monotonic()
        span = None  # the largest of each figure since the last timeline point
        while not self.done.wait(self.period_s):
            sample = self._sample()
            if sample is None:
                continue
            self.peak_used, self.peak_tree_rss = max(self.peak_used, sample[0]), max(self.peak_tree_rss, sample[1])
            self.peak_tree_pss = max(self.peak_tree_pss, sample[4])
            span = sample if span is None else tuple(map(max, span, sample))
            now = time.monotonic()
            if now - last >= self.timeline_s or not self.timeline:
                self._point(now - start, span)
                last, span = now, None
        if span is not None:  # the samples since the last point: the run's end
            self._point(now - start, span)


def run_trainer(recipe: Path, steps: int, resume: bool, log: Path, host_batch: str, run_dir: Path,
                overrides=()) -> dict:
    command = [sys.executable, "-m", "infcl_ds.train", "--config", str(recipe)]
    for override in overrides:  # first: the run's own steps, host form and directory win
        command += ["--set", override]
    command += ["--set", f"schedule.steps={steps}", "--set", f"data.host_batch={host_batch}",
                "--set", f"output_dir={run_dir}"]
    if resume:  # to more steps than the first run's recipe: a schedule change, allowed here
        command += ["--resume", "latest", "--allow-recipe-change"]
    else:  # a measurement again: the previous one's run is moved aside (RUN_DIR.old-<time>)
        command += ["--restart"]
    started = time.monotonic()
    with open(log, "a") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        sampler = MemorySampler(proc.pid)
        sampler.start()
        code = proc.wait()
        sampler.done.set()
        sampler.join()
    if code != 0:
        raise SystemExit(f"trainer exited with {code}; see {log}")
    return {"command": " ".join(command[1:]), "wall_s": time.monotonic() - started,
            "peak_used_gib": sampler.peak_used / GIB, "peak_tree_rss_gib": sampler.peak_tree_rss / GIB,
            "peak_tree_pss_gib": sampler.peak_tree_pss / GIB,
            "host_timeline": sampler.timeline}


def step_rows(run_dir: Path) -> list:
    with open(run_dir / "metrics.csv") as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


def planned(recipe, host_bytes: int, gpu_bytes: int):
    from infcl_ds.plan.plan import make_plan
    plan = make_plan(recipe, 1, gpu_bytes, 1, host_bytes)
    return plan, plan.verdict


def measured_row(row: dict, run: dict, steps: list) -> dict:
    timed = [s for s in steps if s["step"] > 1] or steps  # step 1 includes compilation and tuning
    step_s = sum(s["step_s"] for s in timed) / len(timed)
    wait = sum(s.get("decode_wait_s", 0.0) for s in timed) / len(timed)
    return {**row, "status": "measured", "steps": [int(s["step"]) for s in steps],
            "peak_rss_gib": run["peak_used_gib"], "peak_tree_rss_gib": run["peak_tree_rss_gib"],
            "peak_tree_pss_gib": run["peak_tree_pss_gib"],
            "bytes_per_sample": steps[0].get("host_bytes_per_sample"),
            "peak_gpu_gib": max(s["peak_mem_gib"] for s in steps), "step_s": step_s,
            "decode_wait_s": wait, "decode_wait_share": wait / step_s, "first_step_s": steps[0]["step_s"],
            "losses": [s["loss"] for s in steps], "wall_s": run["wall_s"], "command": run["command"],
            # per 5 s: [s since start, GiB in use above the start, tree RSS GiB, shared GiB, total
            # GiB, tree PSS GiB]
            "host_timeline": run["host_timeline"]}


def decoding(recipe) -> dict:
    """An encoded run's decoder (and the GPU's share of hybrid chunks): part of what it measured."""
    if recipe.data.host_batch != "encoded":
        return {}
    row = {"decoder": recipe.data.decoder}
    if recipe.data.decoder == "hybrid":
        row["gpu_decode_share"] = recipe.data.gpu_decode_share
    return row


def row_key(row: dict) -> tuple:
    """What a row measured: a later run of the same form, decoder, model and batch replaces it."""
    return row["host_batch"], row.get("decoder"), row["model"], row["B"], row["world"]


def merged(out: Path, rows: list) -> list:
    """The rows already in `out` (other batches, other forms) with this run's in their place."""
    old = json.loads(out.read_text())["rows"] if out.is_file() else []
    keys = {row_key(r) for r in rows}
    return [r for r in old if row_key(r) not in keys] + rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.host_memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", type=Path, required=True)
    p.add_argument("--steps", type=int, default=2, help="steps to train to")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in the recipe's output_dir from its latest checkpoint to --steps, and "
                        "add the resumed steps to the encoded row of --out")
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks/host_memory.json"))
    p.add_argument("--host-memory", type=parse_size, default=None,
                   help="the host's memory for the plan and the rows (default: the OS's total, which on the "
                        "lent GPU machines reads low until memory has been used)")
    p.add_argument("--host-batches", default="encoded,decoded", help="host forms to plan and run, comma-separated")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe overrides for every run of this benchmark")
    args = p.parse_args(argv)

    import psutil
    import torch

    from infcl_ds.config import load_recipe
    recipe = load_recipe(args.recipe, overrides=args.overrides)
    log = args.out.with_suffix(".log")
    if args.resume:
        data = json.loads(args.out.read_text())
        # The row the resume adds to, found before minutes of training: this batch's measured run.
        key = ("encoded", recipe.data.decoder, recipe.model.name, recipe.batch.global_size, 1)
        row = next((r for r in data["rows"] if row_key(r) == key and r.get("status") == "measured"), None)
        if row is None:
            raise SystemExit(f"--resume: no measured encoded row of {key[2]} at B={key[3]} decoded by {key[1]} in {args.out}: "
                             f"run without --resume first")
        run_dir = Path(f"{recipe.output_dir}-encoded")
        before = {int(s["step"]) for s in step_rows(run_dir)}
        run = run_trainer(args.recipe, args.steps, True, log, "encoded", run_dir, args.overrides)
        resumed = [s for s in step_rows(run_dir) if int(s["step"]) not in before]
        row["resume"] = measured_row({}, run, resumed)
        row["resume"]["first_step_after_resume"] = int(resumed[0]["step"])
        row["peak_rss_gib"] = max(row["peak_rss_gib"], run["peak_used_gib"])
        row["peak_tree_pss_gib"] = max(row.get("peak_tree_pss_gib", 0.0), run["peak_tree_pss_gib"])
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        print(json.dumps(row["resume"], indent=1), flush=True)
        return data["rows"]

    host_bytes = args.host_memory or psutil.virtual_memory().total
    gpu_bytes = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 80 * GIB
    identity = run_identity()
    rows = []
    for host_batch in args.host_batches.split(","):
        form = load_recipe(args.recipe, overrides=[*args.overrides, f"data.host_batch={host_batch}"])
        plan, line = planned(form, host_bytes, gpu_bytes)
        row = {"host_batch": host_batch, "model": form.model.name, "B": form.batch.global_size, "world": 1,
               "host_gib": host_bytes / GIB, "plan_host_gib": plan.host_bytes / GIB,
               "plan_gpu_gib": plan.peak_gpu_bytes / GIB, "plan_step_s": plan.step_seconds,
               "plan_compute_step_s": plan.time.total, "bytes_per_sample": None, "plan_line": line, **identity,
               **decoding(form)}
        if not plan.fits:
            rows.append({**row, "status": "refused by the planner", "command": f"infcl-ds plan --config "
                         f"{args.recipe} --gpus 1 --host-memory {host_bytes / GIB:.0f}GiB "
                         f"--set data.host_batch={host_batch}"})
            print(f"{host_batch}: {line}", flush=True)
            continue
        run_dir = Path(f"{recipe.output_dir}-{host_batch}")
        run = run_trainer(args.recipe, args.steps, False, log, host_batch, run_dir, args.overrides)
        rows.append(measured_row(row, run, step_rows(run_dir)))
        print(json.dumps(rows[-1], indent=1), flush=True)
        write_rows(args.out, merged(args.out, rows), identity)  # after each form: a call cut short keeps it
    write_rows(args.out, merged(args.out, rows), identity)
    from .plot_data import plot_host_memory
    plot_host_memory(args.out, args.out.with_suffix(".png"))
    return rows


if __name__ == "__main__":
    main()
