"""The training stream (infcl_ds/data/train_stream.py, sources/sampler.py) on CPU: ranks cover the
epoch once, the last batch wraps around, resume is exact (also with worker processes), and the
worker pools stop when the stream is closed.

Sample identity: `id_shards` (tests/data/conftest.py) writes images of one flat colour encoding
the sample id (R + 256 G), which the val transform (resize to the same size, center crop) keeps
exactly."""
import pytest
import torch

from id_samples import NUM_IDS, build, epoch_ids, id_spec

from infcl_ds.data import DataError
from infcl_ds.data.sources.sampler import epoch_order


# ---------------------------------------------------------------------------- distribution

@pytest.mark.parametrize("world_size, local_batch", [(1, 4), (2, 3), (3, 2), (3, 5)])
def test_ranks_cover_the_epoch_once(id_shards, tokenizer, world_size, local_batch):
    per_rank = [build(id_spec(id_shards, worker_batch=2), tokenizer, rank=r, world_size=world_size,
                      local_batch=local_batch, seed=3) for r in range(world_size)]
    steps = NUM_IDS // (world_size * local_batch)
    assert all(d.steps_per_epoch == steps and d.num_samples == NUM_IDS for d in per_rank)
    seen = [epoch_ids(d, 0) for d in per_rank]
    assert all(len(batches) == steps and all(len(b) == local_batch for b in batches) for batches in seen)
    union = [i for batches in seen for b in batches for i in b]
    assert len(union) == len(set(union)) == steps * world_size * local_batch
    # What is left out is the tail of the epoch's permutation: the global remainder.
    assert set(union) == set(epoch_order(NUM_IDS, 3, 0)[:len(union)].tolist())
    # Deterministic for (seed, epoch); another epoch is another order.
    fresh = build(id_spec(id_shards), tokenizer, world_size=world_size, local_batch=local_batch, seed=3)
    assert epoch_ids(fresh, 0) == seen[0]
    assert epoch_ids(fresh, 1) != seen[0]


def test_without_drop_last_the_last_batch_wraps_around(id_shards, tokenizer):
    per_rank = [build(id_spec(id_shards), tokenizer, rank=r, world_size=2, local_batch=5, drop_last=False)
                for r in range(2)]
    assert per_rank[0].steps_per_epoch == 3  # ceil(23 / 10)
    union = [i for d in per_rank for b in epoch_ids(d, 0) for i in b]
    assert len(union) == 30 and set(union) == set(range(NUM_IDS))


# ---------------------------------------------------------------------------- resume

@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_exact(digits_dir, tokenizer, workers):
    spec = {"source": "webdataset", "train": str(digits_dir / "train/shard-000000.tar"), "augment": True}
    layout = dict(rank=1, world_size=2, local_batch=16, seed=7, image_size=32)
    reference = build({**spec, "workers": 0}, tokenizer, **layout)
    reference.set_epoch(2)
    expected = list(reference)
    assert len(expected) == reference.steps_per_epoch == 500 // 32

    # Interrupted runs decode in pieces of 5 (16 = 5 + 5 + 5 + 1), with `workers` processes.
    pieces = {**spec, "workers": workers, "worker_batch": 5}
    first = build(pieces, tokenizer, **layout)
    first.set_epoch(2)
    stream = iter(first)
    head = [next(stream) for _ in range(4)]
    state = first.state_dict()
    stream.close()
    assert state == {"epoch": 2, "step": 4, "skipped": 0}
    # Closing the stream ends its batch-ahead thread there (not at interpreter exit, where a
    # thread inside the DataLoader can abort the process).
    import threading
    assert not [t for t in threading.enumerate() if t.name == "infcl-ds-next-batch"]

    resumed = build(pieces, tokenizer, **layout)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # the trainer's usual call after a resume: keeps the position
    rest = list(resumed)
    assert len(head) + len(rest) == len(expected)
    for got, want in zip(head + rest, expected):
        assert torch.equal(got.decoded(0, len(got))[0], want.decoded(0, len(want))[0]) and torch.equal(got.decoded(0, len(got))[1], want.decoded(0, len(want))[1])
    assert resumed.state_dict()["step"] == resumed.steps_per_epoch and list(resumed) == []
    # The interrupted object itself continues too: its workers (forked once, shared by every
    # iteration) drop the pieces they had prefetched for the stream that was closed.
    again = list(first)
    assert len(again) == len(rest)
    for got, want in zip(again, rest):
        assert torch.equal(got.decoded(0, len(got))[0], want.decoded(0, len(want))[0])


def test_a_stream_stuck_in_its_loader_is_not_restarted_under_it(id_shards, tokenizer, monkeypatch):
    import threading

    from infcl_ds.data import train_stream
    data = build(id_spec(id_shards, worker_batch=4), tokenizer, local_batch=8)
    release, stalled, calls = threading.Event(), threading.Event(), [0]
    load = type(data.dataset).__getitem__

    def slow(self, item):  # the batch-ahead thread stalls inside the loader after the first batch
        calls[0] += 1
        if calls[0] > 8:
            stalled.set()
            release.wait(30)
        return load(self, item)
    monkeypatch.setattr(type(data.dataset), "__getitem__", slow)
    monkeypatch.setattr(train_stream._AssembledAhead, "STOP_TIMEOUT_S", 0.2)
    stream = iter(data)
    next(stream)
    assert stalled.wait(30)
    stream.close()  # stop() gives up after 0.2 s: the thread is still inside the loader
    with pytest.raises(DataError, match="still inside its data loader"):
        next(iter(data))
    release.set()
    # Let the thread leave the loader before the loader is dropped: a loader collected while a
    # thread is still inside it shuts its workers down under that thread.
    data._ahead._thread.join(30)
    assert not data._ahead.running()


def test_close_ends_both_worker_pools(id_shards, tokenizer):
    data = build(id_spec(id_shards, workers=2, decode_workers=2), tokenizer, local_batch=8)
    next(iter(data))
    workers = data._loader._iterator._workers + data.decoder.pool._procs
    assert len(workers) == 4 and all(w.is_alive() for w in workers)
    data.close()
    assert not any(w.is_alive() for w in workers)
    with pytest.raises(DataError, match="closed"):
        next(iter(data))


def test_an_iterator_closed_under_its_consumer_yields_no_partial_batch(id_shards, tokenizer):
    data = build(id_spec(id_shards, workers=2, worker_batch=2), tokenizer, local_batch=8)
    stream = iter(data)
    next(stream)
    data.close()  # from outside the iteration: the batch being read ahead is cut short
    assert data._ahead._results.qsize() == 1  # something waits for the consumer: no wait forever
    with pytest.raises(DataError, match="closed"):
        next(stream)
    assert data.state_dict()["step"] == 1


def test_state_checks(id_shards, tokenizer):
    data = build(id_spec(id_shards), tokenizer)
    data.load_state_dict({"epoch": 1, "step": 2, "skipped": 5})
    data.set_epoch(2)
    assert data.state_dict() == {"epoch": 2, "step": 0, "skipped": 5}
    with pytest.raises(DataError, match="step 99"):
        data.load_state_dict({"epoch": 0, "step": 99, "skipped": 0})
