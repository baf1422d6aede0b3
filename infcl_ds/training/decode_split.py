"""`hybrid`'s split measured: the run's own rates say which share of each chunk the GPU decoder
should take so that both decoders finish together.

`auto` starts from the planner's share, whose rates were measured on other hosts (a decode
process's rate differs from host to host: 178-253 rows/s measured). With `data.gpu_decode_share:
auto` each rank moves its split to what its own rates balance, for the batches assembled after
the move (a batch keeps its split: a row is decoded by the same decoder in both passes). A share
the user set stays, and rank 0 says once which share would balance this host.
"""
import sys
from collections import deque
from typing import Optional, Tuple

from ..data.footprint import balanced_gpu_share

# The step's share spent waiting for decoded rows below which the split is not worth a line.
WAIT_WORTH_A_LINE = 0.05
# A share this close to the measured one is left alone: rates move by more from step to step.
SHARE_CLOSE_ENOUGH = 0.03
# Steps of one split whose rates are read together (one step's GPU decoder rate moved from 1,529
# to 2,863 rows/s on ViT-B-32 at 128k on one H200).
MIN_STEPS_MEASURED = 2
# The shares a split moves within (a chunk of 2,048 rows: at least 41 rows for each decoder).
MOVED_SHARE_BOUNDS = (0.02, 0.98)


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
    return (f"decoding: the last steps waited {wait_s:.1f} s of {step_s:.1f} s for decoded rows{busy}: {pace}. "
            f"At their rates ({workers} processes x {rows_per_process_s:,.0f} rows/s, the GPU decoder "
            f"{gpu_rows_per_s:,.0f} rows/s) data.gpu_decode_share={balanced:.3f} (this run: {share:.3f}) lets both "
            f"finish together; set it in the recipe for the next run")


class SplitWatch:
    """A rank's watch on `hybrid`'s split: its decoders' rates over its last MIN_STEPS_MEASURED
    steps, after the run's first (which starts the decoders and compiles), all at the split in
    force, read from the decoders themselves (one step's rates move too much: the decoders run ahead into the
    next step). `rebalance` (data.gpu_decode_share auto): where those steps waited
    WAIT_WORTH_A_LINE or more of their time, mostly for the rows of the decoder the balance would
    unload, and the share their rates balance is SHARE_CLOSE_ENOUGH or more from the current one,
    the split moves to it; `speaks` (rank 0) says
    so each time. Else rank 0 prints split_advice's line once.

    A decoder's busy rate is not its own: the GPU decoder's calls wait on the towers, which wait
    less for it when it has fewer rows (one H200: 2,148 rows/s at a share of 0.533, 5,069 at
    0.411), so a balance from one split's rates can overshoot. The watch keeps the shares at which
    each decoder's rows held the steps, and a balance past one of those moves halfway to it."""

    def __init__(self, decoder, first_step: int, rebalance: bool = False, speaks: bool = True, out=None):
        self._decoder = decoder if decoder is not None and getattr(decoder, "splits", False) else None
        self._first_step = first_step
        self._rebalance, self._speaks, self._out = rebalance, speaks, out
        self._last = self._totals()
        self._steps: deque = deque(maxlen=MIN_STEPS_MEASURED)  # (share, totals before, wait_s, step_s)
        # The last share at which the GPU decoder's rows held the steps, and the last at which the
        # processes' did: the share that balances them lies between.
        self._gpu_held_at: Optional[float] = None
        self._pool_held_at: Optional[float] = None
        self.said: Optional[str] = None

    def _totals(self) -> Tuple[tuple, tuple]:
        return (self._decoder.pool_rate(), self._decoder.lane_rate()) if self._decoder is not None else ((0, 0.0),) * 2

    def step(self, step: int, batch_share: Optional[float], wait_s: float, step_s: float,
             gpu_wait_s: float = 0.0) -> Optional[str]:
        """After step `step`, which trained a batch split at `batch_share`, waited `wait_s` for
        decoded rows (`gpu_wait_s` of it for the GPU decoder's) and took `step_s`: the line said,
        if any."""
        if self._decoder is None:
            return None
        before, now = self._last, self._totals()
        self._last = now
        if step <= self._first_step + 1 or batch_share is None:
            return None
        self._steps.append((batch_share, before, wait_s, step_s, gpu_wait_s))
        current = self._decoder.gpu_share
        if len(self._steps) < MIN_STEPS_MEASURED or any(share != current for share, *_ in self._steps):
            return None  # the rates of the split in force only (after a move, batches assembled before it)
        first = step - len(self._steps) + 1
        wait_s, step_s, gpu_wait_s = (sum(s[k] for s in self._steps) for k in (2, 3, 4))
        (pool_rows, pool_s), (gpu_rows, gpu_s) = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(now, self._steps[0][1])]
        if pool_s <= 0 or gpu_s <= 0:
            return None
        workers = len(self._decoder.pids)
        per_process, gpu_rate = pool_rows / pool_s, gpu_rows / gpu_s
        balanced = balanced_share(gpu_rate, workers, per_process, batch_share, gpu_rows, pool_rows)
        # Only where the engine waited on the rows of the decoder the balance would unload: a
        # decoder's busy rate says nothing of a window that stops it running ahead (the pool's
        # chunks kept between the passes are all its own in the first pass), and there the other
        # decoder taking more rows would only lengthen the wait.
        pool_wait_s = wait_s - gpu_wait_s
        if (gpu_wait_s <= pool_wait_s) if balanced < batch_share else (pool_wait_s <= gpu_wait_s):
            return None
        if not self._rebalance:
            if self.said:
                return None
            busy = pool_s / (workers * step_s) if workers and step_s > 0 else None
            line = split_advice(batch_share, workers, per_process, busy, gpu_rate, wait_s, step_s, gpu_rows, pool_rows)
        else:
            if step_s <= 0 or wait_s < WAIT_WORTH_A_LINE * step_s:
                return None
            target, halfway = self._bracketed(current, balanced)
            # each decoder keeps some rows of each split chunk: a decoder given none has no rate to read
            target = min(max(target, MOVED_SHARE_BOUNDS[0]), MOVED_SHARE_BOUNDS[1])
            if abs(target - current) < SHARE_CLOSE_ENOUGH:
                return None
            self._decoder.set_gpu_share(target)
            why = (f"; halfway to {halfway:.3f}, where the other decoder's rows held the steps, not {balanced:.3f}"
                   if halfway is not None else "")
            line = (f"decoding: steps {first}-{step} waited {wait_s:.1f} s of {step_s:.1f} s for decoded rows, "
                    f"{gpu_wait_s:.1f} s of it for the GPU decoder's; at their rates ({workers} processes x "
                    f"{per_process:,.0f} rows/s, the GPU decoder {gpu_rate:,.0f} rows/s) data.gpu_decode_share "
                    f"{current:.3f} -> {target:.3f} (auto{why}) from the next batch assembled")
        if line and self._speaks:
            self.said = line
            print(line, file=self._out or sys.stderr, flush=True)
        return line

    def _bracketed(self, current: float, balanced: float) -> Tuple[float, Optional[float]]:
        """(the share to move to, the share it went halfway to or None): `balanced` where it
        stays on this side of the nearest share at which the other decoder's rows held the
        steps, else halfway to that share. Records `current` as held by the decoder the move
        unloads. The split so stays strictly between the two records, which close in on the
        share both decoders' rows allow (kept for the run: a host's rates drift little)."""
        if balanced < current:  # the GPU decoder's rows held these steps
            self._gpu_held_at = current
            bound = self._pool_held_at
            past = bound is not None and balanced <= bound
        else:
            self._pool_held_at = current
            bound = self._gpu_held_at
            past = bound is not None and balanced >= bound
        return ((current + bound) / 2, bound) if past else (balanced, None)
