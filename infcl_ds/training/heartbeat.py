"""A line on rank 0 every minute of a long step: at millions of samples a step takes minutes,
and without it a log says nothing between two steps (or before the first: compilation, the
first batch's decoding). It tells how far the step got and how much of it waited for decoded
rows, read from the batch's counters (data/decoding/encoded.py: `chunks_taken`,
`chunks_announced`, `decode_wait_s`; a batch without them: the time alone)."""
import sys
import threading
import time
from typing import Optional

from ..os_thread_names import NamedThread

EVERY_S = 60.0  # a step shorter than this prints nothing


class StepHeartbeat:
    """`begin(step, steps)` before a step asks for its batch, `batch(batch)` once it has it and
    `end()` after the step; while one runs longer than `every_s`, a line each `every_s` to `out`.
    Holds the batch only while its step runs."""

    def __init__(self, every_s: float = EVERY_S, out=None):
        self.every_s, self.out = every_s, out
        self._cond = threading.Condition()
        self._step: Optional[tuple] = None  # (step, steps, batch, started)
        self._closed = False
        self._thread = NamedThread(target=self._run, daemon=True, name="infcl-ds-heartbeat", os_name="heartbeat")
        self._thread.start()

    def begin(self, step: int, steps: int, batch=None) -> None:
        with self._cond:
            self._step = (step, steps, batch, time.monotonic())
            self._cond.notify_all()

    def batch(self, batch) -> None:
        """The running step's batch, its time so far kept."""
        with self._cond:
            if self._step is not None:
                step, steps, _, started = self._step
                self._step = (step, steps, batch, started)

    def end(self) -> None:
        with self._cond:
            self._step = None  # the batch is the trainer's to drop
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed, self._step = True, None
            self._cond.notify_all()
        self._thread.join(5.0)

    def _run(self) -> None:
        started, beats = None, 0  # the step being watched (by its start), its lines so far
        while True:
            with self._cond:
                if self._closed:
                    return
                if self._step is None:
                    started = None
                    self._cond.wait()
                    continue
                if self._step[3] != started:
                    started, beats = self._step[3], 0
                deadline = started + (beats + 1) * self.every_s
                if time.monotonic() < deadline:
                    # nothing of the step held while waiting: its batch is dropped at its end
                    self._cond.wait(deadline - time.monotonic())
                    continue
                beats += 1
                # under the lock: once end() returns, no line of its step follows
                print(line(*self._step), file=self.out or sys.stderr, flush=True)


def line(step: int, steps: int, batch, started: float) -> str:
    """'step 3/10: 120 s so far, 37 of 512 chunks taken (both passes), 80.2 s waiting for decoded rows'."""
    text = f"step {step}/{steps}: {time.monotonic() - started:.0f} s so far"
    if batch is None:
        return text + ", waiting for its batch (the data readers)"
    announced = getattr(batch, "chunks_announced", 0)
    if announced:
        text += f", {getattr(batch, 'chunks_taken', 0):,} of {announced:,} chunks taken (all passes)"
    if hasattr(batch, "decode_wait_s"):
        text += f", {batch.decode_wait_s:.1f} s waiting for decoded rows"
    return text
