"""The decode window against the step, measured: a rank's real decode pool (one process,
rate-limited so that a local batch takes longer to decode than the grad pass lasts) feeding an
engine that takes its chunks in the engine's order and computes for set times, every row kept
between the passes. With a window smaller than the rows the next step's first pass needs ahead,
the pool stops during the grad pass and the first pass waits; with the window that
`data.decode_window_gib: auto` sizes (plan/overlap.py's window_needed), it runs through the
whole step and nothing waits. The waits measured in the steady steps are compared with the
overlap model's, which the planner's step time uses.

Tolerances: sleeps set every time here, so a loaded machine changes little; the pool's own
overhead per piece (a pipe message, a copy) makes it a little slower than its sleep rate. The
fixed window's wait within 30% + 0.15 s of the model's; auto's under 5% of the step.
"""
import time

import torch

from infcl_ds.data.decoding import encoded
from infcl_ds.data.decoding.decode_pool import DECODE_PIECE_ROWS, window_slots
from infcl_ds.data.decoding.encoded import ChunkDecoder, EncodedBatch
from infcl_ds.plan.overlap import Decoder, StepShape, overlap, tolerance_s, window_needed

RATE = 400.0            # rows a second the one decode process delivers
LOCAL, CHUNK = 512, 64  # a local batch of 8 chunks, all kept between the passes
ENCODE_S, LOSS_S, REENCODE_S = 0.4, 0.05, 1.2  # a batch decodes in 1.28 s, longer than the grad pass
SHAPE = StepShape(local=LOCAL, chunk=CHUNK, kept=LOCAL, passes=2, encode_s=ENCODE_S, loss_s=LOSS_S,
                  reencode_s=REENCODE_S)
STEPS, STEADY = 5, 3    # the last STEADY steps are compared


class SlowPieces:
    """A decode request (EncodedBatch.request) -> blank pixels, after the time RATE gives its rows."""

    def __init__(self, transform=None, seed=0):
        pass

    def __getitem__(self, request):
        row0, blobs, _, _ = request
        time.sleep(len(blobs) / RATE)
        return row0, torch.zeros((len(blobs), 3, 4, 4), dtype=torch.uint8), torch.arange(len(blobs)), 0


def local_batch(decoder: ChunkDecoder, shape: StepShape) -> EncodedBatch:
    piece = (torch.zeros(LOCAL, dtype=torch.uint8), torch.ones(LOCAL, dtype=torch.int64),
             torch.zeros((LOCAL, 4), dtype=torch.int32), torch.arange(LOCAL), 0)
    return EncodedBatch([piece], 0, decoder, keep_rows=shape.kept, host_keep_rows=shape.host_kept)


def measured_waits(window_rows: int, monkeypatch, shape: StepShape = SHAPE) -> list:
    """The engine's wait for decoded rows in each step (decode_wait_s), the next local batch
    assembled (and so announced) as each step starts, as the trainer's batch thread does.
    `window_rows`: the pool's slots, the rows kept between the passes included."""
    monkeypatch.setattr(encoded, "DecodePieces", SlowPieces)  # the pool's processes fork with it
    decoder = ChunkDecoder(None, 0, workers=1, image_size=4, window_rows=window_rows)
    chunks = [(lo, lo + CHUNK) for lo in range(0, LOCAL, CHUNK)]
    waits = []
    try:
        batch = local_batch(decoder, shape)
        for _ in range(STEPS):
            upcoming = local_batch(decoder, shape)
            batch.announce_passes([chunks, chunks])
            for seconds in (ENCODE_S, REENCODE_S):
                for lo, hi in chunks:
                    batch.chunk(lo, hi, torch.device("cpu"))
                    time.sleep(seconds * CHUNK / LOCAL)
                if seconds == ENCODE_S:
                    time.sleep(LOSS_S)
            waits.append(batch.decode_wait_s)
            batch = upcoming
        decoded = decoder.pool_rate()[0]
    finally:
        decoder.close()
    return waits, decoded


def planned_wait(window_rows: int, shape: StepShape = SHAPE) -> float:
    return overlap(shape, [Decoder(RATE, window_slots(window_rows, 1) * DECODE_PIECE_ROWS)]).wait_s


def test_a_window_too_small_stalls_the_first_pass_and_the_auto_window_does_not(monkeypatch):
    small = CHUNK  # one chunk of rows ahead: the pool stops early in the grad pass
    model_small = planned_wait(small)
    assert model_small > 0.5  # the stall the model predicts: most of the next first pass waits
    waits = measured_waits(small, monkeypatch)[0][-STEADY:]
    assert all(abs(w - model_small) <= 0.3 * model_small + 0.15 for w in waits), (waits, model_small)

    auto = window_needed(SHAPE, [Decoder(RATE, 0)], floor=window_slots(0, 1) * DECODE_PIECE_ROWS)
    assert small < auto < 2 * LOCAL
    assert planned_wait(auto) <= tolerance_s(SHAPE)
    waits = measured_waits(auto, monkeypatch)[0][-STEADY:]
    assert max(waits) <= 0.05 * SHAPE.compute_s, waits


def test_rows_kept_in_the_pools_window_are_decoded_once_and_the_auto_window_holds_them_too(monkeypatch):
    """Half the rows kept on the GPU, the other half in the pool's window (keep_decoded_host_gib):
    each row decoded once a step, and with the window `auto` sizes (the kept rows in it as well),
    nothing waits."""
    shape = StepShape(local=LOCAL, chunk=CHUNK, kept=LOCAL // 2, passes=2, encode_s=ENCODE_S, loss_s=LOSS_S,
                      reencode_s=REENCODE_S, host_kept=LOCAL // 2)
    assert shape.decodes == LOCAL
    floor = shape.host_kept + window_slots(0, 1) * DECODE_PIECE_ROWS
    auto = window_needed(shape, [Decoder(RATE, 0)], floor=floor)
    assert floor < auto and planned_wait(auto, shape) <= tolerance_s(shape)
    # the kept rows fill what a window only large enough for them leaves: the first pass waits
    assert planned_wait(floor, shape) > 0.1
    waits, decoded = measured_waits(auto, monkeypatch, shape)
    assert max(waits[-STEADY:]) <= 0.05 * shape.compute_s, waits
    assert decoded <= (STEPS + 1) * LOCAL  # once a step (the next batch's first rows ahead)
