"""The GPU decoder's lane: threads that decode the device's rows of the announced chunks ahead
of the engine (data.decoder nvjpeg, and the GPU's share of hybrid), as the decode pool does for
the CPU's rows. One thread by default; data.gpu_decode_lanes more, each with a piece decoder of
its own, since beside training each library call waits on the busy GPU and such waits overlap.

Decoding on the GPU still costs the host: torchvision parses every JPEG's header and drives
nvJPEG, and the piece's crops are drawn on the CPU (crop_draws.py). Done when the engine asks for a
chunk, that time is the step's; done here, during the towers' work on the chunks before it, it
is hidden wherever the host has time between launches. Each result is a piece decoded on the
lane's CUDA stream with an event behind it: the consumer's stream waits for the event, not the
host (`handed_over`).

At most `window_rows` decoded rows wait on the device (data.gpu_decode_window_gib,
data/footprint.py's device_window_rows; the planner counts them: plan/memory.py), so that the lane
decodes the next local batch's first rows during a step's grad pass, as the pool does. Its
announced pieces wait in a DecodeQueue, as the pool's do (decode_queue.py).
"""
import threading
import time
from typing import Callable, List, Sequence, Union

import torch

from ...os_thread_names import NamedThread
from .decode_queue import DECODE_TIMEOUT_S, DecodeQueue


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
    """The worker behind a DecodeQueue of at most `window_rows` decoded rows (`queue`: where
    pieces are announced and forgotten): decodes its pieces with `decode(request) -> (piece,
    event)` on a thread of its own, or with each of a list of such functions on a thread each
    (the next announced piece to whichever is free; the consumer takes them in order)."""

    def __init__(self, decode: Union[Callable, Sequence[Callable]], device: torch.device, window_rows: int):
        self._decodes = list(decode) if isinstance(decode, (list, tuple)) else [decode]
        self._device = device
        self.queue = DecodeQueue("GPU decoder's lane", window_rows=window_rows, start=self._start)
        self._threads: List[threading.Thread] = []
        # Rows decoded and the lanes' seconds in their decode calls (which return once the
        # library has the piece: its call waits on the GPU), for the rate the run measures.
        self.decoded_rows, self.decode_s = 0, 0.0
        self._counting = threading.Lock()

    def rate(self) -> tuple:
        """(rows decoded, seconds the GPU decoder was busy decoding them) since it started: the
        lanes' seconds in their decode calls shared among the lanes, which decode side by side."""
        with self._counting:
            return self.decoded_rows, self.decode_s / len(self._decodes)

    def take(self, batch_id: int, lo: int, hi: int):
        """The queue's piece [lo, hi) of the batch, handed over to the current stream
        (DecodeQueue.take; None: not announced, the caller decodes it itself)."""
        piece = self.queue.take(batch_id, lo, hi)
        return None if piece is None else handed_over(piece.result)

    def close(self, why: str = "was closed") -> None:
        self.queue.close(why)
        deadline = time.monotonic() + DECODE_TIMEOUT_S  # one wait for all the lanes, not one each
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def _start(self) -> None:  # the queue calls it once
        for k, decode in enumerate(self._decodes):
            suffix = f"-{k}" if len(self._decodes) > 1 else ""
            self._threads.append(NamedThread(target=self._run, args=(decode,), daemon=True,
                                             name=f"infcl-ds-device-decode{suffix}", os_name=f"gpu-decode{suffix}"))
        for thread in self._threads:
            thread.start()

    def _run(self, decode: Callable) -> None:
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        while (got := self.queue.next_piece(wait=True)) is not None:
            self._decode_one(decode, *got)
            del got  # nothing of the piece held while waiting for the next one

    def _decode_one(self, decode: Callable, piece, request) -> None:
        """One piece decoded and handed to the queue; its pixels then held by the queue alone
        (the consumer's last take frees them)."""
        started = time.perf_counter()
        try:
            result = decode(request)
        except Exception as err:  # noqa: BLE001 - raised in the consumer that takes this piece
            self.queue.failed(piece, err)
        else:
            with self._counting:
                self.decoded_rows += piece.hi - piece.lo
                self.decode_s += time.perf_counter() - started
            self.queue.done(piece, result)
