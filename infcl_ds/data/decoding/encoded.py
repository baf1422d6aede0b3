"""Local batches held as the shards store them (a JPEG of ~10-30 KB, not 147 KB of 224 px
pixels), decoded chunk by chunk in the order the engine announces, ahead of it, by a pool of
processes (decode_pool.py) and/or the GPU decoder's lane (device_lane.py).

The engine announces each step's order to its batch (`EncodedBatch.announce_passes`: the chunks
of every pass); chunks kept on the device between the passes are not decoded again. The rank's
ChunkDecoder turns the order into decode pieces for each decoder's queue (decode_queue.py),
remembers it, and announces it for the next batch as soon as that batch is assembled, so during
a step's grad pass the decoders already decode the next step's first chunks. A chunk nobody
announced is decoded in the calling process (slower, same pixels). Every decode of a row gives
bit-identical pixels: the same bytes, augmented under the same per-slot seed
(transforms.transform_image).
"""
import itertools
import threading
from collections import Counter
import time
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from torch.utils.data import Dataset

from ...shown import shown
from ..errors import DataError
from ..sources.samples import load_or_replace
from .batch import normalize
from .decode_pieces import DecodePieces
from .decode_pool import DECODE_PIECE_ROWS, DecodePool
from .decode_queue import DecodeStopped
from .device_decode import BatchedDevicePieces, DevicePieces
from .device_lane import DeviceLane


# -- worker side: reading (no decoding) ---------------------------------------------------
class EncodedTrainDataset(Dataset):
    """(epoch, index) -> (image bytes, caption, slot index, skipped): the decoded
    TrainDataset's item with the image left as stored. Unusable captions and missing images
    are replaced here, by the same rule as the decoded path (sources/samples.py)."""

    def __init__(self, source):
        self.source = source

    def __getitem__(self, item: Tuple[int, int]):
        epoch, index = item
        sample, skipped = load_or_replace(self.source.load_encoded, len(self.source), index)
        return sample.image, sample.caption, index, skipped


class EncodedCollate:
    """Encoded items -> one piece: (bytes uint8 [sum of sizes], sizes int64 [n], texts int32
    [n, ctx], slot indices int64 [n], skipped count)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, items: List[tuple]):
        blobs, captions, indices, skipped = zip(*items)
        data = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8)
        sizes = torch.tensor([len(b) for b in blobs], dtype=torch.int64)
        # int32 holds any tokenizer's ids and halves their share of the held batch; the engine
        # gets int64 (chunk()).
        texts = self.tokenizer(list(captions)).to(torch.int32)
        return data, sizes, texts, torch.tensor(indices, dtype=torch.int64), sum(skipped)


# -- decoding ------------------------------------------------------------------------------
class _InProcess:
    """A piece decoded in the calling process, shaped like decode_pool.Decoded."""

    def __init__(self, result):
        _, self.pixels, self.source, self.replaced = result

    def release(self, after=None) -> None:
        pass


DECODERS = ("pil", "torchvision", "nvjpeg", "hybrid")
Span = Tuple[int, int]


class ChunkDecoder:
    """A rank's decoding (data.decoder):
    - "pil": open_clip's pixels exactly, by `workers` processes (0: in the calling process);
    - "torchvision": torchvision.io's decoder and torch's resize in those processes, the same crops;
    - "nvjpeg": every row on `device` (device_decode.BatchedDevicePieces, with `gpu_jpeg_library`),
      no processes;
    - "hybrid": the first rows of each chunk by the PIL processes, the last `gpu_share` of them
      on `device`: both decode each chunk at once, each at its own rate; a chunk the pool keeps
      between the passes (data.keep_decoded_host_gib) by the processes alone. Each batch splits
      at the share it was assembled with (both its passes alike); set_gpu_share moves the split
      of the batches assembled after it.
    The GPU decodes on `gpu_lanes` threads, each with a piece decoder (a stream) of its own.
    `keeps_on_host`: the batches keep rows in the pool's window between the passes (hybrid then
    starts its processes even at a share of 1: those chunks are theirs).
    The processes are started here, before any batch exists (sampler.SettableSampler says why),
    and kept for the run, with a window of `window_rows` decoded rows (decode_pool.py); the GPU
    decoder's lane holds up to `lane_window_rows` on the device (device_lane.py).

    The order the engine announced last, for batches of its size, is announced to each batch
    assembled after it; a batch assembled first waits for the engine's."""

    def __init__(self, transform, seed: int, workers: int, decoder: str = "pil", device="cpu",
                 image_size: Optional[int] = None, window_rows: int = 0, gpu_share: Optional[float] = None,
                 gpu_jpeg_library: str = "torchvision", lane_window_rows: int = 0, gpu_lanes: int = 1,
                 keeps_on_host: bool = False):
        if decoder not in DECODERS:
            raise DataError(f"data.decoder must be one of {DECODERS}, got {shown(decoder)}")
        # The processes' decoder, and the calling process's for a chunk nobody announced.
        self.pieces = DevicePieces(transform, seed) if decoder == "torchvision" else DecodePieces(transform, seed)
        self.gpu, self.gpu_share, self.lane = None, 0.0, None
        if decoder in ("nvjpeg", "hybrid"):
            lanes = [BatchedDevicePieces(transform, seed, device, gpu_jpeg_library) for _ in range(gpu_lanes)]
            self.gpu = lanes[0]  # also decodes what nobody announced, on the caller's thread
            self.gpu_share = 1.0 if decoder == "nvjpeg" else gpu_share
            if not isinstance(self.gpu_share, (int, float)) or not 0 <= self.gpu_share <= 1:
                raise DataError(f"data.gpu_decode_share must be a number from 0 to 1 for data.decoder=hybrid, "
                                f"got {shown(gpu_share)}")
            self.lane = DeviceLane([pieces.decode for pieces in lanes], self.gpu.device, lane_window_rows)
        self.pool = None
        if workers > 0 and (self.gpu_share < 1 or (decoder == "hybrid" and keeps_on_host)):
            if image_size is None:
                raise ValueError("a decode pool needs the image size (its window's slots)")
            self.pool = DecodePool(self.pieces, workers, window_rows, (3, image_size, image_size))
        self._workers = [worker for worker in (self.pool, self.lane) if worker is not None]
        # Re-entrant: a batch collected while this thread holds it runs _forget (weakref.finalize).
        self._lock = threading.RLock()
        self._order = None  # (rows, passes): the engine's last announced order
        self._waiting: List[weakref.ref] = []  # batches assembled before an order for their size
        self._announced: Dict[int, Tuple[List[Span], List[Span]]] = {}  # serial -> pieces_in(...)
        self._serials = itertools.count()
        self._closed = None

    @property
    def splits(self) -> bool:
        """Both decoders at work (`hybrid` with its processes): the split can move."""
        return self.pool is not None and self.lane is not None

    def set_gpu_share(self, share: float) -> None:
        """The GPU's share of each chunk for the batches assembled from now on (a batch keeps the
        share it was assembled with: both its passes decode a row alike)."""
        if not self.splits:
            raise ValueError("the GPU's share moves only where both decoders run (data.decoder=hybrid "
                             "with decode processes)")
        if not 0 <= share <= 1:
            raise ValueError(f"a GPU share is from 0 to 1, got {share}")
        self.gpu_share = float(share)

    def split(self, lo: int, hi: int, host_kept: bool = False,
              share: Optional[float] = None) -> Tuple[List[Span], Optional[Span]]:
        """Rows [lo, hi) as (the processes' pieces, the device's rows or None), at the batch's
        `share` (default: the current one). A function of the chunk, the batch's kept rows and its
        share alone: a row is decoded by the same decoder in both passes. A chunk the pool keeps
        between the passes (`host_kept`: host_keeps) is the processes' alone, so that none of it
        is decoded twice."""
        share = self.gpu_share if share is None else share
        gpu_rows = 0 if host_kept and self.pool is not None else round((hi - lo) * share)
        cut = hi - gpu_rows
        return _cut(lo, cut), ((cut, hi) if gpu_rows else None)

    def host_keeps(self, lo: int, hi: int, keep_rows: int, host_keep_rows: int) -> bool:
        """Whether the chunk [lo, hi) stays decoded in the pool's window between the passes: in
        the `host_keep_rows` after the `keep_rows` the device keeps, with decode processes."""
        return self.pool is not None and keep_rows < hi <= keep_rows + host_keep_rows

    def pieces_in(self, passes, keep_rows: int, host_keep_rows: int = 0,
                  share: Optional[float] = None) -> Tuple[List[tuple], List[Span]]:
        """The engine's `passes` as the processes' pieces ((lo, hi, uses)) and the device's rows,
        in the order they are first taken; a chunk kept on the device between passes (within
        `keep_rows`) once, and one the pool keeps for the next pass (the `host_keep_rows` after
        those, decoded by the processes alone) once, taken as often as it is asked; each chunk
        split at `share` (split's)."""
        asked = Counter((lo, hi) for chunks in passes for lo, hi in chunks)
        seen, pieces, on_device = set(), [], []
        for chunks in passes:
            for lo, hi in chunks:
                on_host = self.host_keeps(lo, hi, keep_rows, host_keep_rows)
                if (lo, hi) in seen and (hi <= keep_rows or on_host):
                    continue  # served again from the device, or from the pool's window
                seen.add((lo, hi))
                cpu, gpu = self.split(lo, hi, on_host, share)
                pieces += [(a, b, asked[(lo, hi)] if on_host else 1) for a, b in cpu]
                on_device += [gpu] if gpu else []
        return pieces, on_device

    @property
    def pids(self) -> List[int]:
        return self.pool.pids if self.pool is not None else []

    def pool_rate(self) -> tuple:
        """(rows, seconds) the decode processes have spent decoding (DecodePool.rate); (0, 0.0)
        without processes."""
        return self.pool.rate() if self.pool is not None else (0, 0.0)

    def lane_rate(self) -> tuple:
        """(rows, seconds) the GPU decoder has been busy decoding (DeviceLane.rate); (0, 0.0)
        without it."""
        return self.lane.rate() if self.lane is not None else (0, 0.0)

    def register(self, batch: "EncodedBatch") -> int:
        """A new batch: announced now with the engine's last order if it has the same rows,
        else when the engine announces one. Returns the batch's serial number in the queues."""
        serial = next(self._serials)
        weakref.finalize(batch, self._forget, serial)
        with self._lock:
            passes = self._order[1] if self._order is not None and self._order[0] == len(batch) else None
            if passes is None:
                self._waiting.append(weakref.ref(batch))
        if passes is not None:
            self._announce(batch, serial, passes)
        return serial

    def announce_passes(self, batch: "EncodedBatch", passes) -> None:
        """The engine's order for `batch` (and, until it says otherwise, for the batches after it)."""
        with self._lock:
            self._order = (len(batch), passes)
            waiting = [other for other in (ref() for ref in self._waiting) if other is not None and other is not batch]
            self._waiting = [weakref.ref(other) for other in waiting if len(other) != len(batch)]
        self._announce(batch, batch.serial, passes)
        for other in waiting:  # in the order they were assembled
            if len(other) == len(batch):
                self._announce(other, other.serial, passes)

    def _announce(self, batch: "EncodedBatch", serial: int, passes) -> None:
        """`passes` announced to the queues for `batch`; the same pieces again keep what they decoded."""
        announced = self.pieces_in(passes, batch.keep_rows, batch.host_keep_rows, batch.gpu_share)
        with self._lock:
            if self._announced.get(serial) == announced:
                return
            self._announced[serial] = announced
        ref = weakref.ref(batch)  # the queues must not keep a dropped batch alive

        def request(lo, hi):
            return lambda: None if ref() is None else ref().request(lo, hi)
        if self.pool is not None:
            self.pool.queue.announce(serial, [(lo, hi, request(lo, hi), uses) for lo, hi, uses in announced[0]])
        if self.lane is not None:
            self.lane.queue.announce(serial, [(lo, hi, request(lo, hi)) for lo, hi in announced[1]])

    def _forget(self, serial: int) -> None:
        with self._lock:
            self._announced.pop(serial, None)
        for worker in self._workers:
            worker.queue.forget(serial)

    def take(self, serial: int, lo: int, hi: int, request, pin: bool):
        """Rows [lo, hi) of the processes' share decoded: from the pool when announced, else here."""
        if self._closed:
            raise DataError(f"the decode pool {self._closed}: its batches cannot be decoded")
        got = self.pool.take(serial, lo, hi, pin) if self.pool is not None else None
        return got if got is not None else _InProcess(self.pieces[request()])

    def take_on_device(self, serial: int, lo: int, hi: int, request):
        """Rows [lo, hi) decoded on the device, from the lane when announced, else here: (row0,
        uint8 pixels there, source rows, replaced)."""
        got = self.lane.take(serial, lo, hi)
        return got if got is not None else self.gpu[request()]

    def decode_now(self, request):
        return self.pieces[request]

    def close(self, why: str = "was closed (TrainData.close)") -> None:
        """End the decode workers now (not at garbage collection, wherever that happens)."""
        self._closed = why
        for worker in self._workers:
            worker.close(why)


def _cut(lo: int, hi: int) -> List[Span]:
    """Rows [lo, hi) as decode pieces of at most DECODE_PIECE_ROWS rows."""
    return [(p, min(p + DECODE_PIECE_ROWS, hi)) for p in range(lo, hi, DECODE_PIECE_ROWS)]


class EncodedBatch:
    """One rank's local batch: encoded image bytes (as the workers' pieces delivered them), int32
    token ids and each row's slot index; `chunk(lo, hi, device, dtype)` as HostBatch's."""

    def __init__(self, pieces: Sequence[tuple], epoch: int, decoder: ChunkDecoder,
                 mean=OPENAI_DATASET_MEAN, std=OPENAI_DATASET_STD, keep_rows: int = 0, host_keep_rows: int = 0):
        self._blobs = [piece[0] for piece in pieces]
        sizes = [piece[1] for piece in pieces]
        self.texts = torch.cat([piece[2] for piece in pieces])
        self.indices = torch.cat([piece[3] for piece in pieces]).tolist()
        # Row r's bytes: self._blobs[_piece[r]][_start[r]:_start[r] + _size[r]].
        self._piece = np.concatenate([np.full(len(s), p, dtype=np.int32) for p, s in enumerate(sizes)])
        self._size = torch.cat(sizes).numpy()
        self._start = np.concatenate([(s.cumsum(0) - s).numpy() for s in sizes])
        self.epoch, self.decoder = epoch, decoder
        self.mean, self.std = tuple(mean), tuple(std)
        # Chunks within the first `keep_rows` rows stay decoded on their device from the first
        # pass to the second (data.keep_decoded_gib): decoded once per step instead of twice.
        self.keep_rows = keep_rows
        # The chunks in the next `host_keep_rows` rows stay decoded in the decode pool's window
        # between the passes (data.keep_decoded_host_gib): decoded once too, copied again.
        self.host_keep_rows = host_keep_rows
        self._kept = {}               # (lo, hi) -> (uint8 images, int64 texts) on the device
        self._asked = set()           # chunks requested once already
        self.decode_wait_s = 0.0      # time chunk() waited for decoded pieces
        self.decode_wait_gpu_s = 0.0  # the part of it spent waiting for the GPU decoder's rows
        self.chunks_taken = 0         # chunk() calls so far, of the announced passes' chunks_announced
        self.chunks_announced = 0
        self.decode_skipped = 0       # images replaced because they did not decode (counted once)
        self._counted = set()
        self.gpu_share = decoder.gpu_share  # this batch's split, whatever the decoder's moves to
        self.serial = decoder.register(self)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def nbytes(self) -> int:
        """Host bytes this batch holds: encoded images, tokens and the row table."""
        return (sum(b.numel() for b in self._blobs) + self.texts.numel() * self.texts.element_size()
                + 8 * len(self.indices) + self._piece.nbytes + self._size.nbytes + self._start.nbytes)

    def request(self, lo: int, hi: int):
        """The decode request for rows [lo, hi): (row0, their bytes, epoch, slot indices)."""
        rows = zip(self._piece[lo:hi].tolist(), self._start[lo:hi].tolist(), self._size[lo:hi].tolist())
        return lo, [self._blobs[p][s:s + n].numpy().tobytes() for p, s, n in rows], self.epoch, self.indices[lo:hi]

    def announce_passes(self, passes: Sequence[Sequence[Span]]) -> None:
        """The engine's order for this step: `passes`, each a list of (lo, hi) chunks in the
        order it will ask for them. The decoders decode them ahead, chunks kept between the
        passes (keep_rows) once; until an order is announced, chunks are decoded in the calling
        process."""
        passes = [list(map(tuple, chunks)) for chunks in passes]
        self.chunks_announced = sum(map(len, passes))
        self.decoder.announce_passes(self, passes)

    def decoded(self, lo: int, hi: int, device=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Rows [lo, hi): (uint8 images [n, 3, H, W], int64 texts), undecodable images (and
        their tokens) replaced; on `device` (default: the host). A dead or stalled decoder (a
        decode process, the GPU decoder's lane) is a DataError, and the rank's decoding stops."""
        try:
            return self._decoded(lo, hi, torch.device("cpu") if device is None else torch.device(device))
        except DecodeStopped as err:
            self.decoder.close(why=f"stopped when decoding local batch rows {lo}-{hi - 1} failed")
            raise DataError(f"decoding local batch rows {lo}-{hi - 1} failed: {err}") from None

    def _decoded(self, lo: int, hi: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        pieces, on_device = self.decoder.split(lo, hi, self.decoder.host_keeps(lo, hi, self.keep_rows,
                                                                               self.host_keep_rows), self.gpu_share)
        images, rows = None, {}
        if on_device is not None:  # first: the processes go on decoding their rows meanwhile
            a, b = on_device
            started = time.perf_counter()
            _, pixels, source, replaced = self.decoder.take_on_device(self.serial, a, b, lambda: self.request(a, b))
            waited = time.perf_counter() - started
            self.decode_wait_s += waited
            self.decode_wait_gpu_s += waited
            if not pieces and pixels.device == device:
                images = pixels
            else:
                images = torch.empty((hi - lo, *pixels.shape[1:]), dtype=torch.uint8, device=device)
                images[a - lo:b - lo].copy_(pixels, non_blocking=True)
            rows[a] = source + a
            self._count(a, replaced)
        for a, b in pieces:
            started = time.perf_counter()
            piece = self.decoder.take(self.serial, a, b, lambda a=a, b=b: self.request(a, b),
                                      pin=device.type == "cuda")
            self.decode_wait_s += time.perf_counter() - started
            if images is None:
                images = torch.empty((hi - lo, *piece.pixels.shape[1:]), dtype=torch.uint8, device=device)
            # From the pool's page-locked window: the copy overlaps compute. Each piece's slot is
            # given back as soon as its copy is done, so the pool never waits on a whole chunk.
            images[a - lo:b - lo].copy_(piece.pixels, non_blocking=True)
            copied = None
            if device.type == "cuda":
                copied = torch.cuda.Event(blocking=True)  # waited on by the pool's releaser: it sleeps
                copied.record()
            piece.release(copied)
            rows[a] = piece.source + a
            self._count(a, piece.replaced)
        texts = self.texts[torch.cat([rows[a] for a in sorted(rows)])].to(torch.int64)
        return images, texts.to(device, non_blocking=True)

    def _count(self, row0: int, replaced: int) -> None:
        """Replaced images of the piece at row0, counted in its first decode only."""
        if replaced and row0 not in self._counted:
            self._counted.add(row0)
            self.decode_skipped += replaced

    def chunk(self, lo: int, hi: int, device, dtype=torch.float32):
        """Rows [lo, hi) on `device`: (normalised images in `dtype`, int64 texts)."""
        self.chunks_taken += 1
        if (lo, hi) in self._kept:  # the second pass over a kept chunk: freed as it is served
            images, texts = self._kept.pop((lo, hi))
        else:
            images, texts = self.decoded(lo, hi, device)
            if hi <= self.keep_rows and (lo, hi) not in self._asked:
                self._kept[(lo, hi)] = (images, texts)
            self._asked.add((lo, hi))
        return normalize(images, self.mean, self.std, dtype), texts
