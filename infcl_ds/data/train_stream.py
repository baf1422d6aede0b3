"""`build_train_data`: the training stream of one rank, resumable at any step."""
import itertools
import math
import queue
import threading
from typing import List, Optional, Tuple

import torch
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from torch.utils.data import DataLoader, Dataset

from ..config.recipe import DataSection
from ..os_thread_names import NamedThread
from .decoding.batch import HostBatch
from .decoding.encoded import ChunkDecoder, EncodedBatch, EncodedCollate, EncodedTrainDataset
from .decoding.pinned import pinned_empty
from .decoding.transforms import transform_image, uint8_image_transform
from .errors import DataError
from .footprint import WORKER_PREFETCH_FACTOR, device_window_rows, host_kept_rows, kept_rows, pool_window_rows
from .sources.from_recipe import build_source
from .sources.sampler import SettableSampler, rank_batches, require_steps, start_workers, stop_workers
from .sources.samples import load_or_replace


class TrainDataset(Dataset):
    """The decoded host batch's dataset: (epoch, index), as sampler.rank_batches yields ->
    (uint8 image [3, H, W], caption, skipped), skipped being 0 or 1 (sources/samples.py's rule)."""

    def __init__(self, source, transform, seed: int):
        self.source, self.transform, self.seed = source, transform, seed

    def __getitem__(self, item: Tuple[int, int]):
        epoch, index = item
        sample, skipped = load_or_replace(self.source.load, len(self.source), index)
        return transform_image(self.transform, sample.image, self.seed, epoch, index), sample.caption, skipped


class Collate:
    """Samples -> (images uint8 [n, 3, H, W], texts int64 [n, ctx], skipped count), the batch
    tokenized in one call inside the worker: the cheap place for it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, items: List[tuple]):
        images, captions, skipped = zip(*items)
        texts = self.tokenizer(list(captions)).to(torch.int64)
        return torch.stack(images), texts, sum(skipped)


class TrainData:
    """One rank's batches: `set_epoch`, iterate, `state_dict`/`load_state_dict`.

    The position is the number of batches yielded in the current epoch (prefetched pieces and
    the batch assembled ahead do not count): each iteration starts a fresh sampler there, so a
    resume is exact with any number of workers. Use one iterator at a time. The workers are
    forked here, once (sampler.SettableSampler says why). While the caller trains on one batch,
    a thread assembles the next: a rank holds two local batches if the caller drops each before
    asking for the next (infcl_ds/train.py does).
    """

    def __init__(self, dataset, collate, *, rank: int, world_size: int,
                 local_batch: int, seed: int, drop_last: bool, workers: int, worker_batch: int,
                 mean=OPENAI_DATASET_MEAN, std=OPENAI_DATASET_STD, decoder: Optional[ChunkDecoder] = None,
                 keep_rows: int = 0, host_keep_rows: int = 0):
        if not 0 <= rank < world_size or local_batch <= 0 or worker_batch <= 0:
            raise DataError(f"bad layout: rank {rank}, world_size {world_size}, local_batch {local_batch}, "
                            f"worker_batch {worker_batch}")
        self.dataset = dataset
        # With a decoder the batches are EncodedBatch (images as stored, decoded per chunk);
        # without, HostBatch (decoded uint8 pixels).
        self.decoder, self.keep_rows, self.host_keep_rows = decoder, keep_rows, host_keep_rows
        self.mean, self.std = tuple(mean), tuple(std)  # the model's normalisation, applied per chunk
        self.rank, self.world_size, self.local_batch, self.seed = rank, world_size, local_batch, seed
        self.worker_batch = min(worker_batch, local_batch)
        self._pieces_per_step = math.ceil(local_batch / self.worker_batch)
        self.num_samples = len(dataset.source)
        self.steps_per_epoch = require_steps(self.num_samples, world_size * local_batch, drop_last)
        self.epoch, self.step, self.skipped = 0, 0, 0
        self._sampler = SettableSampler()
        self._loader = DataLoader(dataset, batch_sampler=self._sampler, collate_fn=collate, num_workers=workers,
                                  persistent_workers=workers > 0,
                                  prefetch_factor=WORKER_PREFETCH_FACTOR if workers > 0 else None)
        start_workers(self._loader)
        self._ahead: Optional[_AssembledAhead] = None
        self._closed = False

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` at step 0; the current epoch keeps its position, so that
        `load_state_dict` followed by `set_epoch(resumed epoch)` continues where it stopped."""
        if epoch != self.epoch:
            self.epoch, self.step = epoch, 0

    def __iter__(self):
        if self._closed:
            raise DataError("this rank's batches were closed (TrainData.close): build the data again")
        if self._ahead is not None and self._ahead.running():
            # The workers are shared by every iteration: a thread still inside the loader (its
            # stop() gave up waiting) and a restarted loader would interleave their pieces.
            raise DataError("the previous iteration over this rank's batches is still inside its data "
                            "loader (a stalled data worker?): it cannot be restarted")
        self._sampler.requests = rank_batches(self.num_samples, self.seed, self.epoch, self.rank, self.world_size,
                                              self.local_batch, self.step, self.steps_per_epoch, self.worker_batch)
        pieces = iter(self._loader)
        stopping = threading.Event()
        # A batch being assembled when the consumer stops is abandoned between pieces: nobody
        # takes it, and stop() waits for the thread to leave the DataLoader before returning.
        ahead = _AssembledAhead(lambda: self._assemble(itertools.takewhile(
            lambda _: not stopping.is_set(), itertools.islice(pieces, self._pieces_per_step))),
            self.steps_per_epoch - self.step, stopping)
        self._ahead = ahead
        try:
            for batch, skipped in ahead:
                self.step += 1
                self.skipped += skipped
                yield batch
        finally:
            ahead.stop()

    def _assemble(self, pieces):
        """One local batch from its pieces, and how many unusable samples were replaced in it.
        Decoded pieces are copied into host tensors (page-locked when CUDA is available, so that
        HostBatch.chunk's copies overlap compute): one copy of the batch, not two."""
        if self.decoder is not None:
            pieces = list(pieces)
            return (EncodedBatch(pieces, self.epoch, self.decoder, self.mean, self.std, self.keep_rows,
                                 self.host_keep_rows),
                    sum(p[4] for p in pieces))
        images = texts = None
        row = skipped = 0
        for piece_images, piece_texts, piece_skipped in pieces:
            if images is None:
                images = pinned_empty((self.local_batch, *piece_images.shape[1:]), piece_images.dtype)
                texts = pinned_empty((self.local_batch, *piece_texts.shape[1:]), piece_texts.dtype)
            images[row:row + len(piece_images)] = piece_images
            texts[row:row + len(piece_texts)] = piece_texts
            row += len(piece_images)
            skipped += piece_skipped
        return HostBatch(images, texts, self.mean, self.std), skipped

    def close(self) -> None:
        """End the batch-ahead thread and both worker pools (after the last batch is used)."""
        self._closed = True
        if self._ahead is not None:
            self._ahead.stop()
        if self._ahead is None or not self._ahead.running():  # else the thread is still inside the loader
            stop_workers(self._loader)
        if self.decoder is not None:
            self.decoder.close()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step": self.step, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        if not 0 <= state["step"] <= self.steps_per_epoch:
            raise DataError(f"saved data position step {state['step']} is outside this epoch's "
                            f"{self.steps_per_epoch} steps: did the data or the global batch change?")
        self.epoch, self.step, self.skipped = state["epoch"], state["step"], state["skipped"]


class _AssembledAhead:
    """Runs ``make()`` ``count`` times on a thread, one result ahead of the consumer: the next
    is started only once the consumer has taken the last. Errors reach the consumer."""

    _DONE = object()

    def __init__(self, make, count: int, stopping: threading.Event):
        self._results = queue.Queue(maxsize=1)
        self._taken = threading.Semaphore(0)
        self._stopping = stopping
        # The thread's current device is the rank's, so that CUDA work there (page-locking)
        # does not open a context on device 0.
        device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self._thread = NamedThread(target=self._run, args=(make, count, device), daemon=True,
                                   name="infcl-ds-next-batch", os_name="next-batch")
        self._thread.start()

    def _run(self, make, count, device):
        try:
            if device is not None:
                torch.cuda.set_device(device)
            for _ in range(count):
                self._results.put(make())
                self._taken.acquire()  # the consumer has it: only now start the next
                if self._stopping.is_set():
                    return
            self._results.put(self._DONE)
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
            self._results.put(err)

    def __iter__(self):
        while True:
            result = self._results.get()
            if result is self._DONE:
                return
            if isinstance(result, BaseException):
                raise result
            self._taken.release()
            yield result

    def running(self) -> bool:
        return self._thread.is_alive()

    # How long stop() waits for the thread to leave its current piece.
    STOP_TIMEOUT_S = 60.0

    def stop(self) -> None:
        """The consumer is done (end of epoch, or it stopped early): end the thread and wait
        for it, so that it is out of the DataLoader and torch before the process exits (a
        daemon thread inside them at interpreter shutdown can abort the process)."""
        self._stopping.set()
        self._taken.release()
        if threading.current_thread() is not self._thread:
            self._thread.join(self.STOP_TIMEOUT_S)
        if not self._thread.is_alive():
            # A consumer still reading (stopped from outside, TrainData.close) gets an error:
            # not the batch left in the queue, which may be cut short, nor a wait forever.
            try:
                self._results.get_nowait()
            except queue.Empty:
                pass
            self._results.put_nowait(DataError("this rank's batches were closed while being read"))


def build_train_data(data: DataSection, *, rank: int, world_size: int, local_batch: int, seed: int,
                     image_size: int, tokenizer, drop_last: bool = True,
                     mean=OPENAI_DATASET_MEAN, std=OPENAI_DATASET_STD, device=None) -> TrainData:
    """The recipe's `data` section, its `auto` values resolved (training/resolve.py) -> this
    rank's TrainData. `device`: where data.decoder=nvjpeg|hybrid decodes (default: the current
    CUDA device, else the CPU). Errors in the files or paths raise DataError here."""
    source = build_source(data, image_size)
    transform = uint8_image_transform(image_size, augment=data.augment)
    if data.host_batch == "encoded":
        dataset, collate = EncodedTrainDataset(source), EncodedCollate(tokenizer)
        if data.decoder == "auto":
            raise DataError("data.decoder=auto is resolved by the trainer (plan/auto_values.py) before the data is "
                            "built: pass a decoder")
        if data.decode_workers == "auto":
            raise DataError("data.decode_workers=auto is resolved by the trainer (plan/auto_values.py) before "
                            "the data is built: pass a number")
        keep_rows = kept_rows(data.keep_decoded_gib, image_size)
        # whole chunks as the planner resolves it; a given size keeps the whole chunks it covers
        host_keep_rows = host_kept_rows(data, local_batch, image_size, None, keep_rows)
        window = pool_window_rows(data, local_batch, image_size) + host_keep_rows
        if device is None and data.decoder in ("nvjpeg", "hybrid"):
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        if data.gpu_decode_share == "auto" and data.decoder == "hybrid":
            raise DataError("data.gpu_decode_share=auto is resolved by the trainer (plan/auto_values.py) "
                            "before the data is built: pass a number")
        decoder = ChunkDecoder(transform, seed, data.decode_workers, data.decoder, device=device,
                               image_size=image_size, window_rows=window, gpu_share=data.gpu_decode_share,
                               gpu_jpeg_library=data.gpu_jpeg_library, gpu_lanes=data.gpu_decode_lanes,
                               lane_window_rows=device_window_rows(data, local_batch, image_size),
                               keeps_on_host=host_keep_rows > 0)
    else:
        dataset, collate, decoder = TrainDataset(source, transform, seed), Collate(tokenizer), None
        keep_rows = host_keep_rows = 0
    try:
        return TrainData(dataset, collate, rank=rank, world_size=world_size, local_batch=local_batch, seed=seed,
                         drop_last=drop_last, workers=data.workers, worker_batch=data.worker_batch, mean=mean,
                         std=std, decoder=decoder, keep_rows=keep_rows, host_keep_rows=host_keep_rows)
    except BaseException:
        if decoder is not None:  # its pool is already running
            decoder.close()
        raise
