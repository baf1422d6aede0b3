"""Metrics a person can follow: a progress bar, a CSV, TensorBoard, and a PNG at the end.

Only rank 0 writes. On resume the CSV keeps the rows up to the checkpoint's step and drops
the ones a killed run logged after it, so the file reads as one uninterrupted run.
"""
import csv
import time
from pathlib import Path
from typing import Dict, Optional

import torch

from ..run_dir import EVAL_CSV, METRICS, PLOT, TENSORBOARD

COLUMNS = ["step", "epoch", "loss", "lr", "logit_scale", "samples_per_s", "step_s", "peak_mem_gib", "skipped",
           "encode_s", "loss_s", "reencode_s", "optimizer_s", "batch_wait_s", "decode_wait_s",
           "decode_wait_gpu_s",
           "decode_rows_per_process_s", "decode_busy_share", "decode_gpu_rows_per_s", "decode_gpu_share",
           "host_bytes_per_sample",
           "graphs_compiled"]


def peak_memory_gib(device: torch.device) -> float:
    """Peak device memory on GPUs; the process's peak resident set on CPUs."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class PoolRate:
    """Rows per second one decode process of this rank delivered since the last reading (its
    rows over its busy seconds: what the planner's measured rate per process stands for); None
    without decode processes or before they decoded anything."""

    def __init__(self, decoder):
        self._decoder = decoder
        self._last = decoder.pool_rate() if decoder is not None else (0, 0.0)
        self._clock = time.perf_counter()
        self.busy_share: Optional[float] = None  # of the interval of the last since_last

    def since_last(self) -> Optional[float]:
        if self._decoder is None:
            return None
        now, clock = self._decoder.pool_rate(), time.perf_counter()
        rows, seconds = now[0] - self._last[0], now[1] - self._last[1]
        workers = len(self._decoder.pids)
        # The share of the interval the decode processes spent decoding: near 1, decoding is what
        # the step waits on, whatever decode_wait_s says (the engine may have been slowed rather
        # than stopped); well below, they waited for a free slot in the window. A piece counts when
        # it is done, so a short interval's share can pass 1 by part of a piece.
        self.busy_share = seconds / (workers * (clock - self._clock)) if workers and clock > self._clock else None
        self._last, self._clock = now, clock
        return rows / seconds if seconds > 0 else None


class GpuDecodeRate:
    """Rows per second the GPU decoder (data.decoder nvjpeg and hybrid) delivered since the last
    reading, over the seconds it was busy decoding them (DeviceLane.rate); None without it or
    before it decoded anything."""

    def __init__(self, decoder):
        self._decoder = decoder if getattr(decoder, "lane", None) is not None else None
        self._last = self._decoder.lane_rate() if self._decoder is not None else (0, 0.0)

    def since_last(self) -> Optional[float]:
        if self._decoder is None:
            return None
        now = self._decoder.lane_rate()
        rows, seconds = now[0] - self._last[0], now[1] - self._last[1]
        self._last = now
        return rows / seconds if seconds > 0 else None


class MetricsLogger:
    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool, resume_step: int = 0):
        self.enabled = enabled
        self.path = Path(run_dir) / METRICS
        self.extra_path = Path(run_dir) / EVAL_CSV
        self.writer = None
        if not enabled:
            return
        self._truncate_after(self.path, resume_step, COLUMNS)
        self._truncate_after(self.extra_path, resume_step)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(str(Path(run_dir) / TENSORBOARD), purge_step=resume_step + 1)

    @staticmethod
    def _truncate_after(path: Path, step: int, columns=None) -> None:
        """Keep the rows up to `step`; with `columns`, under today's header (a run written by an
        older version gets the new columns, empty in its rows)."""
        if not path.is_file():
            return
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            return
        with open(path, "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=columns or list(rows[0].keys()), restval="", extrasaction="ignore")
            out.writeheader()
            out.writerows(r for r in rows if int(r["step"]) <= step)

    def _append(self, path: Path, row: Dict) -> None:
        new = not path.is_file()
        with open(path, "a", newline="") as f:
            out = csv.DictWriter(f, fieldnames=list(row.keys()))
            if new:
                out.writeheader()
            out.writerow(row)

    def log_step(self, row: Dict) -> None:
        if not self.enabled:
            return
        self._append(self.path, {k: row.get(k, "") for k in COLUMNS})
        if self.writer is not None:
            for key in COLUMNS[2:]:
                if row.get(key) not in (None, ""):
                    self.writer.add_scalar(f"train/{key}", float(row[key]), row["step"])

    def log_eval(self, step: int, results: Dict[str, float]) -> None:
        if not self.enabled:
            return
        self._append(self.extra_path, {"step": step, **results})
        if self.writer is not None:
            for key, value in results.items():
                self.writer.add_scalar(f"eval/{key}", value, step)

    def close(self) -> Optional[Path]:
        """Flush TensorBoard and draw the curves; returns the PNG's path (rank 0)."""
        if not self.enabled:
            return None
        if self.writer is not None:
            self.writer.close()
        return plot_metrics(self.path.parent)


def plot_metrics(run_dir: Path) -> Optional[Path]:
    """metrics.csv (and eval.csv) -> metrics.png: loss, logit scale, lr, throughput, eval."""
    run_dir = Path(run_dir)
    if not (run_dir / METRICS).is_file():
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(run_dir / METRICS, newline="") as f:
        rows = list(csv.DictReader(f))
    evals = []
    if (run_dir / EVAL_CSV).is_file():
        with open(run_dir / EVAL_CSV, newline="") as f:
            evals = list(csv.DictReader(f))
    panels = [("loss", "loss"), ("logit_scale", "logit scale (exp)"), ("lr", "learning rate"),
              ("samples_per_s", "samples / s")]
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(4 * (len(panels) + 1), 3.2))
    steps = [int(r["step"]) for r in rows]
    for ax, (key, title) in zip(axes, panels):
        ax.plot(steps, [float(r[key]) if r[key] else float("nan") for r in rows])
        ax.set_title(title)
        ax.set_xlabel("step")
    ax = axes[-1]
    for key in [k for k in (evals[0].keys() if evals else []) if k != "step"]:
        ax.plot([int(r["step"]) for r in evals], [float(r[key]) for r in evals], marker="o", label=key)
    ax.set_title("evaluation")
    ax.set_xlabel("step")
    if evals:
        ax.legend(fontsize=7)
    fig.tight_layout()
    out = run_dir / PLOT
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
