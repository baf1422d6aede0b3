"""`hybrid`'s split measured: each step's own rates say which share of each chunk the GPU
decoder should take so that both decoders finish together.

`auto` starts from the planner's share, whose rates were measured on other hosts (a decode
process's rate differs from host to host: 178-253 rows/s measured). With `data.gpu_decode_share:
auto` each rank moves its split to what its own rates balance, for the batches assembled after
the step (a batch keeps its split: a row is decoded by the same decoder in both passes). A share
the user set stays, and rank 0 says once which share would balance this host.
"""
import sys
from typing import Optional

from ..data.footprint import balanced_gpu_share
from .metrics import GpuDecodeRate, PoolRate

# The step's share spent waiting for decoded rows below which the split is not worth a line.
WAIT_WORTH_A_LINE = 0.05
# A share this close to the measured one is left alone: rates move by more from step to step.
SHARE_CLOSE_ENOUGH = 0.03


def balanced_share(gpu_rows_per_s: float, workers: int, rows_per_process_s: float, share: float = 0.0,
                   gpu_rows: int = 0, pool_rows: int = 0) -> float:
    """footprint.balanced_gpu_share at the run's rates; where the step also had chunks the
    processes decode alone (those the pool keeps between the passes), those rows counted from the
    rows each decoder decoded at `share`."""
    cpu = workers * rows_per_process_s
    if not (0 < share and gpu_rows and pool_rows):
        return balanced_gpu_share(gpu_rows_per_s, cpu)
    split = gpu_rows / share  # rows of the chunks both decode
    alone = max(0.0, pool_rows - (1 - share) * split)
    return balanced_gpu_share(gpu_rows_per_s, cpu, split + alone, alone)


def split_advice(share, workers: int, rows_per_process_s: Optional[float], busy_share: Optional[float],
                 gpu_rows_per_s: Optional[float], wait_s: float, step_s: float, gpu_rows: int = 0,
                 pool_rows: int = 0) -> Optional[str]:
    """The line for the log, or None: `hybrid` only (a share strictly between 0 and 1), both rates
    measured, the step waiting at least WAIT_WORTH_A_LINE of its time, and the balanced share
    (from the rows each decoder decoded, where given) SHARE_CLOSE_ENOUGH or more from the run's."""
    if not isinstance(share, (int, float)) or not 0 < share < 1 or not workers:
        return None
    if not rows_per_process_s or not gpu_rows_per_s or step_s <= 0 or wait_s < WAIT_WORTH_A_LINE * step_s:
        return None
    balanced = balanced_share(gpu_rows_per_s, workers, rows_per_process_s, share, gpu_rows, pool_rows)
    if abs(balanced - share) < SHARE_CLOSE_ENOUGH:
        return None
    pace = "the GPU decoder's share sets the pace" if balanced < share else "the decode processes' share sets the pace"
    busy = f", the processes busy {busy_share:.0%} of it" if busy_share is not None else ""
    return (f"decoding: the step waited {wait_s:.1f} s of {step_s:.1f} s for decoded rows{busy}: {pace}. At this "
            f"step's rates ({workers} processes x {rows_per_process_s:,.0f} rows/s, the GPU decoder "
            f"{gpu_rows_per_s:,.0f} rows/s) data.gpu_decode_share={balanced:.3f} (this run: {share:.3f}) lets both "
            f"finish together; set it in the recipe for the next run")


class SplitWatch:
    """A rank's watch on `hybrid`'s split, from the second step it trains on (the first starts the
    decoders and compiles): each step's rates read from the decoders themselves. `rebalance`
    (data.gpu_decode_share auto): where the step waited WAIT_WORTH_A_LINE or more of its time and
    the balanced share is SHARE_CLOSE_ENOUGH or more from the current one, the split moves to it;
    `speaks` (rank 0) says so each time. Else rank 0 prints split_advice's line once."""

    def __init__(self, decoder, first_step: int, rebalance: bool = False, speaks: bool = True, out=None):
        self._decoder = decoder if decoder is not None and getattr(decoder, "splits", False) else None
        self._first_step = first_step
        self._rebalance, self._speaks, self._out = rebalance, speaks, out
        self._pool, self._gpu = PoolRate(self._decoder), GpuDecodeRate(self._decoder)
        self.said: Optional[str] = None

    def step(self, step: int, batch_share: Optional[float], wait_s: float, step_s: float) -> Optional[str]:
        """After step `step`, which trained a batch split at `batch_share`, waited `wait_s` for
        decoded rows and took `step_s`: the line said, if any."""
        if self._decoder is None:
            return None
        per_process, gpu_rate = self._pool.since_last(), self._gpu.since_last()
        if step <= self._first_step + 1 or batch_share is None:
            return None
        workers, current = len(self._decoder.pids), self._decoder.gpu_share
        if not self._rebalance:
            if self.said:
                return None
            line = split_advice(batch_share, workers, per_process, self._pool.busy_share, gpu_rate, wait_s, step_s,
                                self._gpu.rows, self._pool.rows)
        else:
            if not per_process or not gpu_rate or step_s <= 0 or wait_s < WAIT_WORTH_A_LINE * step_s:
                return None
            balanced = balanced_share(gpu_rate, workers, per_process, batch_share, self._gpu.rows, self._pool.rows)
            if abs(balanced - current) < SHARE_CLOSE_ENOUGH:
                return None
            self._decoder.set_gpu_share(balanced)
            line = (f"decoding: step {step} waited {wait_s:.1f} s of {step_s:.1f} s for decoded rows; at its rates "
                    f"({workers} processes x {per_process:,.0f} rows/s, the GPU decoder {gpu_rate:,.0f} rows/s) "
                    f"data.gpu_decode_share {current:.3f} -> {balanced:.3f} (auto) from the next batch assembled")
        if line and self._speaks:
            self.said = line
            print(line, file=self._out or sys.stderr, flush=True)
        return line
