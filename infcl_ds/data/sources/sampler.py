"""Which samples each rank takes at each step: a global permutation per (seed, epoch), cut into
global batches of G = world_size * local_batch; rank r takes rows [r*L, (r+1)*L) of each.

Every rank derives the same permutation from the same (seed, epoch) without communicating, so
an epoch covers each sample once across ranks and every rank has the same number of steps,
however uneven the shards are. A position is a number of global batches, so a resume starts
the sampler at that step (also with a different world size, if the global batch is the same).
"""
import gc
import math
from typing import Iterator, List, Tuple

import numpy as np

from ..errors import DataError


def steps_per_epoch(num_samples: int, global_batch: int, drop_last: bool) -> int:
    """drop_last: the global remainder (< one global batch) is dropped; else the last global
    batch is completed by wrapping around to the start of the permutation."""
    return num_samples // global_batch if drop_last else math.ceil(num_samples / global_batch)


def require_steps(num_samples: int, global_batch: int, drop_last: bool = True) -> int:
    """`steps_per_epoch`, or a DataError where it is 0: the samples do not fill one global batch.
    The trainer's data (train_stream.TrainData) and `infcl-ds data check` both refuse here."""
    steps = steps_per_epoch(num_samples, global_batch, drop_last)
    if steps == 0:
        raise DataError(f"{num_samples:,} samples do not fill one global batch of {global_batch:,} (batch.global): "
                        "not one training step could run")
    return steps


def epoch_order(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's permutation of sample indices, a pure function of (seed, epoch) for a given
    numpy version (all ranks of a job run the same one)."""
    return np.random.default_rng((seed, epoch)).permutation(num_samples)


def rank_batches(num_samples: int, seed: int, epoch: int, rank: int, world_size: int, local_batch: int,
                 start_step: int, steps: int, worker_batch: int) -> Iterator[List[Tuple[int, int]]]:
    """One rank's local batches from `start_step` to the end of the epoch, each cut into
    pieces of at most `worker_batch` (epoch, sample index) pairs.

    A piece is one DataLoader task: the workers decode a huge local batch in parallel, and
    only workers x prefetch pieces are in flight instead of whole batches. The epoch travels
    with each index because the dataset seeds augmentation with it, and the dataset may live in
    worker processes that never see `set_epoch`.
    """
    order = epoch_order(num_samples, seed, epoch)
    global_batch = world_size * local_batch
    offsets = rank * local_batch + np.arange(local_batch)
    for step in range(start_step, steps):
        rows = order[(step * global_batch + offsets) % num_samples].tolist()
        for lo in range(0, local_batch, worker_batch):
            yield [(epoch, i) for i in rows[lo:lo + worker_batch]]


class SettableSampler:
    """A persistent DataLoader's (batch) sampler: it yields whatever iterator was set last.

    Worker processes are forked once, when the loader is built, and serve every later stream
    set here. Forking them early matters for memory, not only for start-up time: a process
    forked while the parent holds a local batch keeps that batch's pages mapped (and so
    allocated) for its whole life, after the parent has freed it: a worker pool forked at the
    first batch holds one local batch more than the two the trainer keeps.
    """

    def __init__(self):
        self.requests: Iterator = iter(())

    def __iter__(self):
        return self.requests


def start_workers(loader) -> None:
    """Fork a persistent DataLoader's workers now (with nothing to do: its sampler is empty),
    while the process holds no batch (SettableSampler).

    Unreachable objects are collected first: a forked worker inherits the parent's garbage, and
    a collection there would run the __del__ of a dropped loader's iterator, which signals
    *that* loader's workers (still the parent's, or already gone) to shut down."""
    if loader.num_workers > 0:
        gc.collect()
        for _ in loader:  # the empty stream ends at once; the workers stay
            raise RuntimeError("start_workers: the loader's sampler was not empty")


def stop_workers(loader) -> None:
    """End a persistent DataLoader's workers now. Left to the garbage collector, a dropped
    loader's iterator shuts its workers down wherever a collection happens to run: in another
    pool's freshly forked worker, or under a thread still reading from it, where its queues'
    file descriptors are closed twice (and a reused descriptor number can be another pipe's)."""
    iterator, loader._iterator = getattr(loader, "_iterator", None), None
    if iterator is not None:
        iterator._shutdown_workers()  # what the iterator's __del__ would run, at a known time
