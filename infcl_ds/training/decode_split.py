"""`hybrid`'s split measured: where the step waited for decoded rows and the rates this host
showed would split each chunk otherwise, a line that says which `data.gpu_decode_share` would
let both decoders finish together.

The split is fixed for the run (a row is decoded by the same decoder in both passes and at a
resume: the pixels of the two passes must match), and `auto` takes it from rates measured on
other hosts; a decode process's rate differs from host to host (178-253 rows/s measured), so the
run's own rates are the better guide, and the user the one to set them.
"""
import sys
from typing import Optional

from ..data.footprint import balanced_gpu_share

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
    """Rank 0's watch on `hybrid`'s split: the line of split_advice at most once a run, from the
    second step it trains on (the first starts the decoders and compiles)."""

    def __init__(self, decoder, first_step: int, out=None):
        both = decoder is not None and getattr(decoder, "pool", None) is not None and decoder.lane is not None
        self._decoder = decoder if both else None
        self._first_step = first_step
        self._out = out
        self.said: Optional[str] = None

    def step(self, step: int, row: dict) -> Optional[str]:
        """After a logged step's `row` (metrics.COLUMNS, and the rows each decoder decoded since the
        last: decode_gpu_rows, decode_pool_rows): the line, printed, if it is time for it."""
        if self.said or self._decoder is None or step <= self._first_step + 1:
            return None
        line = split_advice(self._decoder.gpu_share, len(self._decoder.pids), row.get("decode_rows_per_process_s"),
                            row.get("decode_busy_share"), row.get("decode_gpu_rows_per_s"),
                            row.get("decode_wait_s") or 0.0, row.get("step_s") or 0.0,
                            row.get("decode_gpu_rows") or 0, row.get("decode_pool_rows") or 0)
        if line:
            self.said = line
            print(line, file=self._out or sys.stderr, flush=True)
        return line
