"""The queue of announced decode pieces (data/decoding/decode_queue.py) and the two workers behind
it: the decode processes (decode_pool.py) and the GPU decoder's lane (device_lane.py, run on the CPU
here).

Checked: pieces go out in the announced order within the window (rows, or the pool's slots);
taking a piece drops what was announced before it and gives back what held it; the next local
batch is decoded ahead with the engine's last order, across the step; a dead or stalled worker
is one DataError, not a hang; a piece that fails raises where it is taken; a closed queue says
why; the worker processes are forked before any batch exists.
"""
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
import webdataset as wds

from data_section import data_section
from encoded_shards import (IMAGE_SIZE, SAMPLES, announce_both_passes, both_passes, chunks_of, first_batch,  # noqa: F401
                            in_process, photo_jpeg, pool_data, shard, tokenizer, wait_until)
from infcl_ds.data import DataError, build_train_data
from infcl_ds.data.decoding import decode_queue
from infcl_ds.data.decoding.decode_queue import DecodeQueue, DecodeStopped
from infcl_ds.data.decoding.device_lane import DeviceLane


# -------------------------------------------------------------------- the queue alone

def decoded_by_a_worker(queue, count):
    """`count` pieces handed out to a worker and decoded: their (lo, hi)."""
    spans = []
    for _ in range(count):
        piece, request = queue.next_piece()
        queue.done(piece, request)
        spans.append((piece.lo, piece.hi))
    return spans


def test_pieces_go_out_in_the_announced_order_within_the_window():
    started = []
    queue = DecodeQueue("test queue", window_rows=16, start=lambda: started.append(1))
    queue.announce(0, [(0, 8, lambda: "a"), (8, 16, lambda: "b"), (16, 40, lambda: "c")])
    queue.announce(1, [(0, 8, lambda: None), (8, 16, lambda: "e")])  # its first request: the batch is gone
    assert started == [1]  # the worker starts at the first announcement only
    assert decoded_by_a_worker(queue, 2) == [(0, 8), (8, 16)]
    assert queue.next_piece() is None  # 16 rows wait: no room
    assert queue.take(0, 0, 8).result == "a"
    assert queue.next_piece() is None  # 8 rows wait, and 24 more would exceed 16
    assert queue.take(0, 8, 16).result == "b"
    assert decoded_by_a_worker(queue, 1) == [(16, 40)]  # larger than the window: alone
    assert queue.take(0, 16, 40).result == "c"
    assert decoded_by_a_worker(queue, 1) == [(8, 16)]  # (0, 8)'s batch was gone at its turn: dropped
    assert queue.take(1, 0, 8) is None  # never decoded: the caller decodes it
    assert queue.queued() == {1: [(8, 16, "ready")]}


def test_a_local_batch_of_millions_of_rows_costs_the_queue_constant_time_a_piece():
    """512k rows a step are 16,384 pieces of 32, announced for two passes and the next batch: the
    worker's next request and the window's count do not scan them (the dispatcher thread shares
    the training process's interpreter). 2 x 16,384 pieces through a window of 4,096 rows, each
    announced, decoded, done and taken, in a few seconds even on a loaded 2-core machine (a scan
    per request made it 2 x 16,384 x 16,384 steps: minutes)."""
    pieces = 16_384
    queue = DecodeQueue("test queue", window_rows=4096)
    spans = [(32 * i, 32 * i + 32, lambda: True) for i in range(pieces)]
    started = time.perf_counter()
    queue.announce(0, spans)
    queue.announce(1, spans)
    for batch in (0, 1):
        for lo in range(0, 32 * pieces, 32):
            got = queue.next_piece()
            if got is None:  # the window is full: the engine takes the oldest piece first
                raise AssertionError(f"no piece to decode at row {lo} of batch {batch}")
            queue.done(got[0], lo)
            assert queue.take(batch, lo, lo + 32).result == lo
    assert queue.queued() == {1: []} and time.perf_counter() - started < 20


def test_taking_a_piece_drops_what_came_before_and_releases_its_pixels():
    released = []
    queue = DecodeQueue("test queue", release=lambda piece: released.append((piece.lo, piece.hi)))
    queue.announce(0, [(0, 8, lambda: 0), (8, 16, lambda: 1)])
    queue.announce(1, [(0, 8, lambda: 2), (8, 16, lambda: 3), (16, 24, lambda: 4)])
    decoded_by_a_worker(queue, 4)
    decoding, _ = queue.next_piece()
    assert queue.take(1, 8, 16).result == 3  # batch 0 and (0, 8) of batch 1 are past
    assert sorted(released) == [(0, 8), (0, 8), (8, 16)]  # decoded and dropped: their slots given back
    assert queue.done(decoding, 4)  # (16, 24) is still wanted
    assert queue.queued() == {1: [(16, 24, "ready")]}
    queue.announce(1, [(16, 24, lambda: 5), (24, 32, lambda: 6)])  # announced again: what it had is dropped
    assert released[-1] == (16, 24) and queue.queued() == {1: [(16, 24, "announced"), (24, 32, "announced")]}
    queue.forget(1)
    assert queue.queued() == {} and queue.next_piece() is None


def test_a_stalled_worker_closes_the_queue_and_every_later_call_says_why(monkeypatch):
    monkeypatch.setattr(decode_queue, "DECODE_TIMEOUT_S", 0.2)
    queue = DecodeQueue("test queue")
    queue.announce(0, [(0, 8, lambda: 0), (8, 16, lambda: 1)])
    piece, _ = queue.next_piece()
    with pytest.raises(DecodeStopped, match=r"^the test queue gave no decoded piece in 0.2 s \(a stalled decoder\?\)$"):
        queue.take(0, 0, 8)
    assert queue.queued() == {} and not queue.done(piece, 0)  # dropped: its worker frees what it holds
    for call in (lambda: queue.take(0, 8, 16), lambda: queue.announce(1, [])):
        with pytest.raises(DecodeStopped, match="gave no decoded piece"):
            call()
    queue.close("was closed")  # the first reason stays
    with pytest.raises(DataError, match="gave no decoded piece"):
        queue.take(0, 8, 16)


def test_closing_wakes_a_consumer_and_a_waiting_worker():
    queue = DecodeQueue("test queue", window_rows=8)
    queue.announce(0, [(0, 8, lambda: 0)])
    queue.next_piece()
    results = []
    worker = threading.Thread(target=lambda: results.append(queue.next_piece(wait=True)))
    worker.start()  # the window is full: it waits
    threading.Timer(0.2, queue.close, args=("stopped: its worker died",)).start()
    with pytest.raises(DecodeStopped, match="^the test queue stopped: its worker died$"):
        queue.take(0, 0, 8)
    worker.join(5)
    assert results == [None]


# -------------------------------------------------------------------- the decode processes and the lane

def test_the_next_batch_is_decoded_ahead_in_the_announced_order_across_the_step(shard, tokenizer):
    """Once the engine has announced its order, the batch assembled ahead is announced with it at
    once: the pool decodes its first pieces before any of them is asked for (as during a grad
    pass), and they are the pixels decoded in process, in either pass."""
    data = pool_data(shard, tokenizer)
    batches = iter(data)
    first = next(batches)
    chunks = [(0, 8), (8, 16), (16, 20)]
    first.announce_passes([chunks, chunks])
    pool = first.decoder.pool
    for _ in range(2):
        for lo, hi in chunks:
            assert torch.equal(first.decoded(lo, hi)[0], in_process(first, lo, hi))
    # The next batch, assembled ahead, is announced and decoded without being asked.
    wait_until(lambda: len(pool.queue.queued()) == 2)
    second_serial = list(pool.queue.queued())[-1]
    # Its first pass at least: the window (two slots per process here) holds four pieces.
    wait_until(lambda: [state for *_, state in pool.queue.queued()[second_serial][:3]] == ["ready"] * 3)
    del first
    second = next(batches)
    assert second.serial == second_serial
    passes = [[second.decoded(lo, hi)[0] for lo, hi in chunks] for _ in range(2)]
    for lo_hi, one, two in zip(chunks, *passes):
        assert torch.equal(one, two) and torch.equal(one, in_process(second, *lo_hi))
    assert not pool.queue.queued()[second_serial]  # every announced piece was taken: none decoded in process


def test_a_one_pass_batch_and_kept_chunks_are_announced_once(shard, tokenizer):
    data = pool_data(shard, tokenizer)
    batch = next(iter(data))
    announced = lambda: batch.decoder._announced[batch.serial]  # noqa: E731
    batch.announce_passes([[(0, 20)]])  # one chunk: the engine encodes it once, with grad
    assert announced() == ([(0, 20, 1)], [])  # (the processes' pieces (lo, hi, uses), the GPU decoder's: none)
    batch.keep_rows = 16
    batch.announce_passes([[(0, 8), (8, 16), (16, 20)]] * 2)  # kept chunks (hi <= 16) are not announced again
    assert announced() == ([(0, 8, 1), (8, 16, 1), (16, 20, 1), (16, 20, 1)], [])
    first, second = both_passes(batch, chunk=8)
    for (im1, tx1), (im2, tx2) in zip(first, second):
        assert torch.equal(im1, im2) and torch.equal(tx1, tx2)


def test_rows_kept_in_the_pools_window_are_decoded_once_and_taken_in_both_passes(shard, tokenizer):
    """data.keep_decoded_host_gib: the chunks after the GPU's kept ones are announced once, for two
    takes; the second pass takes the same decoded pixels from the pool's window, and only then
    gives the slot back."""
    data = pool_data(shard, tokenizer, decode_window_gib=1.0)
    batch = next(iter(data))
    batch.keep_rows, batch.host_keep_rows = 8, 8
    batch.announce_passes([[(0, 8), (8, 16), (16, 20)]] * 2)
    assert batch.decoder._announced[batch.serial] == ([(0, 8, 1), (8, 16, 2), (16, 20, 1), (16, 20, 1)], [])
    pool = batch.decoder.pool
    first, second = both_passes(batch, chunk=8)
    for (im1, tx1), (im2, tx2) in zip(first, second):
        assert torch.equal(im1, im2) and torch.equal(tx1, tx2)
    wait_until(lambda: pool.rate()[0] == 8 + 8 + 4 + 4)  # (8, 16) decoded once: 24 rows, not 28
    assert pool.rate()[1] > 0


def test_rows_kept_in_the_window_between_the_passes_cost_the_queue_constant_time_a_take():
    """The paper's load on a rank, 512k rows: 16,384 pieces of 32, the last 8,192 (the rows the GPU
    cannot keep) announced for a take in each pass. A piece taken once stays, ready, until its
    second take; the first pass's later takes and the second pass's must not walk past those
    (a scan per take made the first pass 8,192 x 8,192 steps under the queue's lock: a minute
    of a GPU rank's step, the decode processes' dispatcher blocked behind it). Here: 0.3 s, and
    4.4 s with that scan, on the 2-core machine."""
    pieces, kept = 16_384, 8_192
    queue = DecodeQueue("test queue")
    queue.announce(0, [(32 * i, 32 * i + 32, lambda: True, 2 if i >= pieces - kept else 1) for i in range(pieces)])
    for lo in range(0, 32 * pieces, 32):
        got = queue.next_piece()
        queue.done(got[0], lo)
    started = time.perf_counter()
    for lo in [*range(0, 32 * pieces, 32), *range(32 * (pieces - kept), 32 * pieces, 32)]:
        assert queue.take(0, lo, lo + 32).result == lo
    assert queue.queued() == {0: []} and time.perf_counter() - started < 2


def test_a_piece_announced_for_two_takes_stays_ready_until_its_last():
    released = []
    queue = DecodeQueue("test queue", release=lambda piece: released.append((piece.lo, piece.hi)))
    queue.announce(0, [(0, 8, lambda: "a", 2), (8, 16, lambda: "b"), (16, 24, lambda: "c")])
    decoded_by_a_worker(queue, 3)
    first = queue.take(0, 0, 8)
    assert first.result == "a" and first.uses == 1  # one take left: still held
    assert queue.take(0, 8, 16).result == "b"  # the piece taken once before it is not dropped
    assert queue.queued() == {0: [(0, 8, "ready"), (16, 24, "ready")]} and released == []
    again = queue.take(0, 0, 8)
    assert again is first and again.uses == 0 and queue.queued() == {0: [(16, 24, "ready")]}
    queue.forget(0)
    assert released == [(16, 24)]  # dropped unused: given back; (0, 8) is the consumer's to give back


def ask_for_the_rest(batch):
    """Both passes' chunks of 8 after the first: the pieces already in the window may be served
    after a worker died (the pool reports the death once it sees it, or when it needs a decode);
    the second pass cannot be, since the window (two slots per process) was full of the first
    pass's pieces when the workers were stopped."""
    for lo in [*range(8, SAMPLES, 8), *range(0, SAMPLES, 8)]:
        batch.chunk(lo, lo + 8, torch.device("cpu"))


def test_a_dead_decode_worker_is_an_error_not_a_hang(shard, tokenizer):
    batch = first_batch(shard, tokenizer, "encoded", decode_workers=2)
    announce_both_passes(batch, 8)
    batch.chunk(0, 8, torch.device("cpu"))  # the pool is running
    for pid in batch.decoder.pids:
        os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(DataError, match=r"decoding local batch rows .* decode worker \d+ was killed by SIGKILL"):
        ask_for_the_rest(batch)
    assert time.monotonic() - started < 30
    with pytest.raises(DataError, match="decode pool stopped"):  # and it stays an error
        batch.decoded(0, 8)


def test_a_decode_worker_dying_after_the_error_is_not_reported_again(shard, tokenizer):
    """The broken pool stops at once and reaps its workers: one that dies later (a CI run: after
    the DataError, before the test's teardown) is reported nowhere, by no signal handler."""
    batch = first_batch(shard, tokenizer, "encoded", decode_workers=2)
    announce_both_passes(batch, 8)
    batch.chunk(0, 8, torch.device("cpu"))
    first, *others = batch.decoder.pids
    os.kill(first, signal.SIGKILL)
    with pytest.raises(DataError, match="decoding local batch rows"):
        ask_for_the_rest(batch)
    for pid in others:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.5)
    assert not any(p.is_alive() for p in batch.decoder.pool._procs)


def test_a_stalled_decode_worker_is_an_error_within_the_timeout(shard, tokenizer, monkeypatch):
    monkeypatch.setattr(decode_queue, "DECODE_TIMEOUT_S", 2)
    batch = first_batch(shard, tokenizer, "encoded", decode_workers=1)
    announce_both_passes(batch, 8)
    batch.chunk(0, 8, torch.device("cpu"))
    os.kill(batch.decoder.pids[0], signal.SIGSTOP)
    started = time.monotonic()
    try:
        with pytest.raises(DataError, match="gave no decoded piece in 2 s"):
            ask_for_the_rest(batch)
    finally:
        os.kill(batch.decoder.pids[0], signal.SIGCONT)
    assert time.monotonic() - started < 20


def test_worker_pools_are_forked_before_any_batch_and_do_not_pin_freed_batches(tmp_path, tokenizer):
    """A process forked while the trainer holds a local batch keeps that batch's pages for its
    life (on a GPU: a 512k run took one local batch, 15 GiB, more host memory than planned).
    Both pools (reading, decoding) are forked when the data is built, and the same processes
    serve every batch; after the caller dropped its batch, the shared memory held is two
    batches' (the last one yielded, referenced by the iterator until the next is asked for, and
    the one assembled ahead), not three (3.0 measured with pools forked at the first batch).
    Each image carries 200 kB of bytes after its JPEG's end (ignored by the decoder), so that a
    batch is tens of MB of shared memory."""
    import psutil
    rng = np.random.default_rng(1)
    path = tmp_path / "shard-000000.tar"
    with wds.TarWriter(str(path)) as sink:
        for i in range(400):
            sink.write({"__key__": f"{i:09d}", "jpg": photo_jpeg(i, rng) + bytes(200_000), "txt": f"photo {i}"})
    spec = {"source": "webdataset", "train": str(path), "workers": 2, "worker_batch": 25,
            "host_batch": "encoded", "decode_workers": 2}
    shared_before = psutil.virtual_memory().shared
    data = build_train_data(data_section(spec), rank=0, world_size=1, local_batch=100, seed=7, image_size=IMAGE_SIZE,
                            tokenizer=tokenizer)
    workers = {p.pid for p in psutil.Process().children(recursive=True)}
    assert len(workers) >= 4, "both pools start when the data is built"
    batches, batch_bytes = iter(data), 0
    for _ in range(3):
        batch = next(batches)
        batch_bytes = max(batch_bytes, batch.nbytes)
        both_passes(batch, 50)
        del batch
    time.sleep(1.0)
    held = psutil.virtual_memory().shared - shared_before
    assert {p.pid for p in psutil.Process().children(recursive=True)} == workers
    assert batch_bytes > 20e6
    # a batch pinned by a worker forked while it was held would add 1.0
    assert held < 2.5 * batch_bytes, (held / batch_bytes, held, batch_bytes)
    batches.close()


def test_the_gpu_decoders_lane_decodes_ahead_in_the_announced_order(shard, tokenizer):
    """nvjpeg's rows are decoded on the lane's thread as soon as the order is announced, within
    the window (data.gpu_decode_window_gib: here 20 rows), and what the engine takes equals a
    decode in place."""
    window_gib = 20 * 3 * IMAGE_SIZE ** 2 / 2 ** 30
    batch = first_batch(shard, tokenizer, "encoded", decoder="nvjpeg", gpu_decode_window_gib=window_gib)
    lane, chunk = batch.decoder.lane, 8
    chunks = [(lo, lo + chunk) for lo in range(0, SAMPLES, chunk)]
    batch.announce_passes([chunks])
    ready = lambda: [(lo, hi) for lo, hi, state in lane.queue.queued()[batch.serial] if state == "ready"]  # noqa: E731
    wait_until(lambda: len(ready()) == 2)
    time.sleep(0.2)
    assert ready() == chunks[:2]  # 16 rows: a third chunk would not fit in 20
    for lo, hi in chunks:
        assert torch.equal(batch.decoded(lo, hi)[0], batch.decoder.gpu[batch.request(lo, hi)][1].cpu())


def test_a_piece_the_lane_cannot_decode_is_raised_where_it_is_taken():
    def decode(request):
        if request == "bad":
            raise DataError("local batch rows 8-15: no image of these 8 decodes")
        return (0, torch.full((2,), request), None, 0), None
    lane = DeviceLane(decode, torch.device("cpu"), window_rows=8)
    lane.queue.announce(0, [(0, 8, lambda: 1), (8, 16, lambda: "bad"), (16, 24, lambda: 3)])
    assert torch.equal(lane.take(0, 0, 8)[1], torch.full((2,), 1))
    with pytest.raises(DataError, match="rows 8-15: no image"):
        lane.take(0, 8, 16)
    assert torch.equal(lane.take(0, 16, 24)[1], torch.full((2,), 3))
    lane.close()
    with pytest.raises(DataError, match="was closed"):
        lane.take(0, 16, 24)


def test_the_lanes_pixels_are_freed_at_their_last_take_while_their_batch_lives_on():
    """A taken piece leaves its batch (and its order) and the lane's thread keeps nothing of it:
    the engine's copy of its rows (kept between the passes) is then the only one on the GPU. A
    piece taken again later (`uses` 2) stays until its second take."""
    import gc
    import weakref
    made = {}

    def decode(request):
        made[request] = torch.full((4,), request)
        return (0, made[request], None, 0), None
    lane = DeviceLane(decode, torch.device("cpu"), window_rows=64)
    lane.queue.announce(0, [(0, 8, lambda: 1), (8, 16, lambda: 2, 2), (16, 24, lambda: 3)])
    wait_until(lambda: len(made) == 3)
    pixels = {request: weakref.ref(tensor) for request, tensor in made.items()}
    made.clear()
    for lo, hi in ((0, 8), (8, 16), (16, 24)):
        lane.take(0, lo, hi)
    gc.collect()
    assert pixels[1]() is None and pixels[3]() is None  # the batch is still announced
    assert pixels[2]() is not None  # wanted again
    lane.take(0, 8, 16)
    gc.collect()
    assert pixels[2]() is None
    lane.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the pool's page-locked window and device copies need CUDA")
def test_pool_pixels_copied_to_the_gpu_equal_the_pixels_decoded_in_process(shard, tokenizer):
    """On CUDA the window is page-locked and each piece is copied to the device asynchronously,
    its slot given back once the copy is done: the device's pixels are those decoded in process,
    over several batches' worth of reuse of every slot."""
    spec = {"source": "webdataset", "train": str(shard), "workers": 0, "host_batch": "encoded",
            "decode_workers": 2, "decode_window_gib": 1e-9}  # the smallest window: slots reused at once
    data = build_train_data(data_section(spec), rank=0, world_size=1, local_batch=SAMPLES // 2, seed=7,
                            image_size=IMAGE_SIZE, tokenizer=tokenizer)
    batches = iter(data)
    for _ in range(2):  # the epoch's two batches
        batch = next(batches)
        assert batch.decoder.pool.arena.shape[0] == 4  # two slots per worker
        batch.announce_passes([chunks_of(batch, 7)])
        on_gpu = [batch.decoded(lo, min(lo + 7, len(batch)), "cuda") for lo in range(0, len(batch), 7)]
        torch.cuda.synchronize()
        want = torch.cat([batch.decoder.decode_now(batch.request(lo, min(lo + 32, len(batch))))[1]
                          for lo in range(0, len(batch), 32)])
        assert torch.equal(torch.cat([im for im, _ in on_gpu]).cpu(), want)
        del batch
    batches.close()
