"""The GPU decoder's lane with several threads (data.gpu_decode_lanes): pieces decoded side by
side, each once, taken in the announced order, each lane with a piece decoder of its own; the
same pixels as one lane. On CPU tensors (the library's CPU decoder), as the other lane tests."""
import threading

import pytest
import torch
from encoded_shards import SAMPLES, both_passes, first_batch, shard, tokenizer, wait_until  # noqa: F401

from infcl_ds.data.decoding.device_lane import DeviceLane


def test_lanes_decode_side_by_side_each_piece_once_and_are_taken_in_order():
    both_running = threading.Barrier(2, timeout=20)  # broken unless two lanes decode at once
    decoded, lock = [], threading.Lock()

    def lane_decode(k):
        def decode(request):
            if request < 2:
                both_running.wait()
            with lock:
                decoded.append((request, k, threading.current_thread().name))
            return (0, torch.full((3,), request), None, 0), None
        return decode
    lane = DeviceLane([lane_decode(0), lane_decode(1)], torch.device("cpu"), window_rows=64)
    lane.queue.announce(0, [(8 * r, 8 * r + 8, lambda r=r: r) for r in range(6)])
    taken = [lane.take(0, 8 * r, 8 * r + 8)[1] for r in range(6)]
    assert [t.tolist() for t in taken] == [[r] * 3 for r in range(6)]
    assert sorted(request for request, _, _ in decoded) == list(range(6))  # each once
    first_two = {(k, name) for request, k, name in decoded if request < 2}
    assert {k for k, _ in first_two} == {0, 1}  # one piece on each lane, at once
    assert {name for _, name in first_two} == {"infcl-ds-device-decode-0", "infcl-ds-device-decode-1"}
    lane.close()
    assert all(not thread.is_alive() for thread in lane._threads)


def test_one_lanes_failure_is_raised_where_its_piece_is_taken_and_the_others_go_on():
    def decode(request):
        if request == 1:
            raise ValueError("rows 8-15 would not decode")
        return (0, torch.full((1,), request), None, 0), None
    lane = DeviceLane([decode, decode, decode], torch.device("cpu"), window_rows=64)
    lane.queue.announce(0, [(0, 8, lambda: 0), (8, 16, lambda: 1), (16, 24, lambda: 2)])
    assert lane.take(0, 0, 8)[1].item() == 0
    with pytest.raises(ValueError, match="rows 8-15"):
        lane.take(0, 8, 16)
    assert lane.take(0, 16, 24)[1].item() == 2
    lane.close()


def test_three_lanes_give_the_pixels_of_one(shard, tokenizer):  # noqa: F811
    """data.gpu_decode_lanes=3 against 1 on the same batch: each lane a piece decoder of its own,
    every chunk's pixels and texts the same, in both passes."""
    batches = {lanes: first_batch(shard, tokenizer, "encoded", decoder="nvjpeg", gpu_decode_lanes=lanes)
               for lanes in (1, 3)}
    lane = batches[3].decoder.lane
    assert len(lane._decodes) == 3 and len({id(d.__self__) for d in lane._decodes}) == 3
    passes = {lanes: both_passes(batch, 5) for lanes, batch in batches.items()}
    wait_until(lambda: len([t for t in lane._threads if t.is_alive()]) == 3)
    for one, three in zip(passes[1], passes[3]):
        for (pixels_1, texts_1), (pixels_3, texts_3) in zip(one, three):
            assert torch.equal(pixels_1, pixels_3) and torch.equal(texts_1, texts_3)
    assert len(passes[3][0]) == -(-SAMPLES // 5)
    # the counters the trainer's heartbeat reads: every announced chunk taken, in both passes
    assert batches[3].chunks_announced == batches[3].chunks_taken == 2 * -(-SAMPLES // 5)
    for batch in batches.values():
        batch.decoder.close()
    wait_until(lambda: not any(t.is_alive() for t in lane._threads))


def test_the_lanes_count_their_rows_and_share_their_busy_seconds():
    """DeviceLane.rate: rows of the pieces decoded, and the seconds in the decode calls over the
    lane count (lanes decode side by side); a failed piece counts neither."""
    import time
    inside = []  # each call's own seconds

    def decode(request):
        if request == 3:
            raise ValueError("rows 24-31 would not decode")
        started = time.perf_counter()
        time.sleep(0.2)
        inside.append(time.perf_counter() - started)
        return (0, torch.zeros(1), None, 0), None
    lane = DeviceLane([decode, decode], torch.device("cpu"), window_rows=64)
    assert lane.rate() == (0, 0.0)
    lane.queue.announce(0, [(8 * r, 8 * r + 8, lambda r=r: r) for r in range(4)])
    for r in range(3):
        lane.take(0, 8 * r, 8 * r + 8)
    with pytest.raises(ValueError):
        lane.take(0, 24, 32)
    rows, seconds = lane.rate()
    assert rows == 24 and len(inside) == 3
    # the calls' seconds over the 2 lanes (not their sum: 0.6 s or more)
    assert sum(inside) / 2 <= seconds < sum(inside) / 2 + 0.15
    lane.close()
