"""The GPU decoder's lane: one thread that decodes the device's rows of the planned chunks
ahead of the engine (data.decoder nvjpeg, and the GPU's share of hybrid), as the decode pool
does for the CPU's rows.

Decoding on the GPU still costs the host: torchvision parses every JPEG's header and drives
nvJPEG, and the piece's crops are drawn on the CPU (data/crop_draws.py). Done when the engine asks for a
chunk, that time is the step's; done here, during the towers' work on the chunks before it, it
is hidden wherever the host has time between launches. Each result is a piece decoded on the
lane's CUDA stream with an event behind it: the consumer's stream waits for the event, not the
host (`handed_over`).

At most `window_rows` decoded rows wait on the device (data.decode_window_gib times the GPU's
share of each chunk; the planner counts them: plan/memory.py): enough, at the default, for the
lane to decode most of the next local batch during a step's grad pass, as the pool does.
"""
import threading
import time
from collections import OrderedDict
from typing import Callable, List, Optional

import torch

from .decode_pool import DECODE_TIMEOUT_S
from .errors import DataError



class _Entry:
    __slots__ = ("lo", "hi", "request", "state", "result", "error", "taken")

    def __init__(self, lo: int, hi: int, request: Callable):
        self.lo, self.hi, self.request = lo, hi, request
        self.state = "planned"  # -> decoding -> ready (or failed); dropped when skipped
        self.result = self.error = None
        self.taken = False


def handed_over(result):
    """A lane result ((row0, pixels, source, replaced), CUDA event or None) made usable on the
    calling thread's current stream: it waits for the event, and the pixels' memory is not
    reused before the work queued on it so far is done."""
    piece, event = result
    if event is not None:
        stream = torch.cuda.current_stream(piece[1].device)
        stream.wait_event(event)
        piece[1].record_stream(stream)
    return piece


class DeviceLane:
    """Decodes planned pieces with `decode(request) -> (piece, event)` on a thread, at most
    `window_rows` decoded rows ahead (one piece at least); `take` returns one (None if it was not
    planned: the caller decodes it itself)."""

    def __init__(self, decode: Callable, device: torch.device, window_rows: int):
        self._decode, self._device, self._window = decode, device, window_rows
        self._cond = threading.Condition()
        self._batches: "OrderedDict[int, List[_Entry]]" = OrderedDict()
        self._thread: Optional[threading.Thread] = None
        self._closed: Optional[str] = None

    def plan(self, batch_id: int, pieces: List[tuple]) -> None:
        """(lo, hi, make request) pieces of a batch, in the order they will be taken; a batch
        planned again drops what it had planned and not taken."""
        with self._cond:
            self._batches[batch_id] = [_Entry(lo, hi, request) for lo, hi, request in pieces]
            if self._thread is None and self._closed is None:
                # Started at the first plan: after every fork of the build (decode and data workers).
                self._thread = threading.Thread(target=self._run, daemon=True, name="infcl-ds-device-decode")
                self._thread.start()
            self._cond.notify_all()

    def forget(self, batch_id: int) -> None:
        with self._cond:
            self._batches.pop(batch_id, None)
            self._cond.notify_all()

    def take(self, batch_id: int, lo: int, hi: int):
        """The planned piece [lo, hi) of the batch, handed over to the current stream, waiting
        for it; pieces planned before it, and earlier batches, are dropped."""
        with self._cond:
            if self._closed is not None:
                raise DataError(f"the GPU decoder's lane {self._closed}")
            order = list(self._batches)
            if batch_id not in self._batches:
                return None
            for earlier in order[:order.index(batch_id)]:
                del self._batches[earlier]
            entries = self._batches[batch_id]
            at = next((i for i, e in enumerate(entries) if (e.lo, e.hi) == (lo, hi) and not e.taken), None)
            if at is None:
                return None
            entry = entries[at]
            del entries[:at]
            entry.taken = True
            self._cond.notify_all()
            deadline = time.monotonic() + DECODE_TIMEOUT_S
            while entry.state in ("planned", "decoding") and self._closed is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DataError(f"the GPU decoder gave no decoded rows {lo}-{hi - 1} in {DECODE_TIMEOUT_S} s")
                self._cond.wait(min(left, 1.0))
            if entry in entries:
                entries.remove(entry)
            self._cond.notify_all()
            if entry.state == "failed":
                raise entry.error
            if self._closed is not None:
                raise DataError(f"the GPU decoder's lane {self._closed}")
            if entry.state == "dropped":  # its batch was let go meanwhile: the caller decodes it
                return None
            result = entry.result
        return handed_over(result)

    def close(self, why: str = "was closed") -> None:
        with self._cond:
            if self._closed is None:
                self._closed = why
            self._batches.clear()
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(DECODE_TIMEOUT_S)

    def _next(self) -> Optional[_Entry]:
        """The earliest planned piece, if it fits in the window beside the rows waiting."""
        waiting = sum(e.hi - e.lo for entries in self._batches.values() for e in entries
                      if e.state in ("ready", "decoding"))
        for entries in self._batches.values():
            for entry in entries:
                if entry.state == "planned":
                    return entry if not waiting or waiting + entry.hi - entry.lo <= self._window else None
        return None

    def _run(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        while True:
            with self._cond:
                entry = self._next()
                while entry is None and self._closed is None:
                    self._cond.wait()
                    entry = self._next()
                if self._closed is not None:
                    return
                entry.state = "decoding"
            request = entry.request()
            try:
                result = None if request is None else self._decode(request)
                state, error = ("ready" if result is not None else "dropped"), None
            except Exception as err:  # noqa: BLE001 - raised in the consumer that takes this piece
                state, error, result = "failed", err, None
            with self._cond:
                entry.state, entry.result, entry.error = state, result, error
                self._cond.notify_all()
