"""Local batches held as the shards store them (a JPEG of ~10-30 KB, not 147 KB of 224 px
pixels), decoded chunk by chunk in the order the engine announces, by a pool of processes
(decode_pool.py) that decodes ahead without idling at pass or step boundaries.

The engine announces each batch's order (`EncodedBatch.schedule`: its chunks, in one pass or
two); chunks kept on the device between the passes are not decoded again. The pool remembers
the order and plans the next batch with it as soon as that batch is assembled, so during a
step's grad pass it already decodes the next step's first chunks. A request out of the planned
order is decoded in the calling process (slower, same pixels). Every decode of a row gives
bit-identical pixels: the same bytes, augmented under the same per-slot seed
(transforms.transform_image).
"""
import itertools
import threading
import time
import weakref
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from torch.utils.data import Dataset

from ..shown import shown
from .batch import normalize
from .decode_pool import DECODE_PIECE_ROWS, DecodePool, DecodePoolError
from .errors import DataError
from .samples import SkipSample, decode_image, load_or_replace
from .transforms import transform_image

# Passes of the engine over a local batch of several chunks when it announced nothing: without
# grad, then with grad (engine/step.py).
ENGINE_PASSES = 2


# -- worker side: reading (no decoding) ---------------------------------------------------
class EncodedTrainDataset(Dataset):
    """(epoch, index) -> (image bytes, caption, slot index, skipped): the decoded
    TrainDataset's item with the image left as stored. Unusable captions and missing images
    are replaced here, by the same rule as the decoded path (samples.py)."""

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
class DecodePieces(Dataset):
    """A decode request -> the piece's pixels. Request: (row0, blobs, epoch, slot indices);
    result: (row0, uint8 [n, 3, H, W], source rows int64 [n] (row r shows row source[r] of the
    piece, r itself unless its image did not decode: then the next decodable row of the piece,
    wrapping around), count of rows replaced)."""

    def __init__(self, transform, seed: int):
        self.transform, self.seed = transform, seed

    def images(self, blobs, epoch: int, indices) -> List[Optional[torch.Tensor]]:
        """Each blob's augmented uint8 [3, H, W] image, None where it does not decode."""
        images = []
        for blob, index in zip(blobs, indices):
            try:
                images.append(transform_image(self.transform, decode_image(blob), self.seed, epoch, index))
            except SkipSample:
                images.append(None)
        return images

    def __getitem__(self, request):
        row0, blobs, epoch, indices = request
        images = self.images(blobs, epoch, indices)
        source = replacement_sources([image is not None for image in images], row0)
        pixels = torch.stack([images[s] for s in source])
        return row0, pixels, torch.tensor(source, dtype=torch.int64), sum(image is None for image in images)


def replacement_sources(decoded: Sequence[bool], row0: int) -> List[int]:
    """Row r of a piece shows row source[r]: r itself if it `decoded`, else the next row of the
    piece that did (wrapping around). A piece with none is a DataError naming its rows."""
    usable = [r for r, ok in enumerate(decoded) if ok]
    if not usable:
        raise DataError(f"local batch rows {row0}-{row0 + len(decoded) - 1}: no image of these "
                        f"{len(decoded)} decodes")
    return [r if decoded[r] else next((u for u in usable if u > r), usable[0]) for r in range(len(decoded))]


class _InProcess:
    """A piece decoded in the calling process, shaped like decode_pool.Decoded."""

    def __init__(self, result):
        _, self.pixels, self.source, self.replaced = result

    def release(self, after=None) -> None:
        pass


DECODERS = ("pil", "torchvision", "nvjpeg", "hybrid")


class ChunkDecoder:
    """A rank's decoding (data.decoder):
    - "pil": open_clip's pixels exactly, by `workers` processes (0: in the calling process);
    - "torchvision": torchvision.io's decoder and torch's resize in those processes, the same crops;
    - "nvjpeg": every row on `device` (device_decode.BatchedDevicePieces), no processes;
    - "hybrid": the first rows of each chunk by the PIL processes, the last `gpu_share` of them
      on `device`: both decode each chunk at once, each at its own rate.
    The processes are started here, before any batch exists (sampler.SettableSampler says why),
    and kept for the run, with a window of `window_rows` decoded rows (decode_pool.py)."""

    def __init__(self, transform, seed: int, workers: int, decoder: str = "pil", device="cpu",
                 image_size: Optional[int] = None, window_rows: int = 0, gpu_share: Optional[float] = None):
        if decoder not in DECODERS:
            raise DataError(f"data.decoder must be one of {DECODERS}, got {shown(decoder)}")
        if decoder == "torchvision":
            from .device_decode import DevicePieces  # it builds on this module
            self.pieces = DevicePieces(transform, seed)
        else:  # the processes' decoder, and the calling process's for a chunk out of the plan
            self.pieces = DecodePieces(transform, seed)
        self.gpu, self.gpu_share, self.lane = None, 0.0, None
        if decoder in ("nvjpeg", "hybrid"):
            from .device_decode import BatchedDevicePieces
            from .device_lane import DeviceLane
            self.gpu = BatchedDevicePieces(transform, seed, device)
            self.gpu_share = 1.0 if decoder == "nvjpeg" else gpu_share
            if not isinstance(self.gpu_share, (int, float)) or not 0 <= self.gpu_share <= 1:
                raise DataError(f"data.gpu_decode_share must be a number from 0 to 1 for data.decoder=hybrid, "
                                f"got {shown(gpu_share)}")
            # The GPU's share of the window: what the planner counts on the device.
            self.lane = DeviceLane(self.gpu.decode, self.gpu.device, int(window_rows * self.gpu_share))
        self.pool = None
        if workers > 0 and self.gpu_share < 1:
            if image_size is None:
                raise ValueError("a decode pool needs the image size (its window's slots)")
            self.pool = DecodePool(self.pieces, workers, window_rows, (3, image_size, image_size))
        self._lock = threading.Lock()
        self._schedule = None  # (rows, passes): the engine's last announced order
        self._waiting: List[weakref.ref] = []  # batches assembled before any order was known
        self._serials = itertools.count()
        self._closed = None

    def split(self, lo: int, hi: int) -> Tuple[List[Tuple[int, int]], Optional[Tuple[int, int]]]:
        """Rows [lo, hi) as (the processes' pieces, the device's rows or None). A function of
        the chunk alone: a row is decoded by the same decoder in both passes and at a resume."""
        gpu_rows = round((hi - lo) * self.gpu_share)
        cut = hi - gpu_rows
        return _cut(lo, cut), ((cut, hi) if gpu_rows else None)

    def decode_on_device(self, serial: int, lo: int, hi: int, request: Callable):
        """Rows [lo, hi) decoded on the device, from the lane when planned, else here: (row0,
        uint8 pixels there, source rows, replaced)."""
        got = self.lane.take(serial, lo, hi)
        return got if got is not None else self.gpu[request()]

    @property
    def pids(self) -> List[int]:
        return self.pool.pids if self.pool is not None else []

    def register(self, batch: "EncodedBatch") -> int:
        """A new batch: planned now with the last announced order if it has the same rows, else
        when the engine announces one. Returns the batch's serial number in the pool."""
        serial = next(self._serials)
        for planner in (self.pool, self.lane):
            if planner is not None:
                weakref.finalize(batch, planner.forget, serial)
        with self._lock:
            known = self._schedule
            if known is None or known[0] != len(batch):
                self._waiting.append(weakref.ref(batch))
                known = None
        if known is not None:
            batch._plan(known[1], serial)
        return serial

    def announce(self, batch: "EncodedBatch", passes) -> None:
        """The engine's order for `batch` (and, until it says otherwise, for the batches after it)."""
        with self._lock:
            self._schedule = (len(batch), passes)
            waiting, self._waiting = [ref() for ref in self._waiting], []
        batch._plan(passes)
        for other in waiting:  # in the order they were assembled
            if other is not None and other is not batch:
                if len(other) == len(batch):
                    other._plan(passes)
                else:
                    with self._lock:
                        self._waiting.append(weakref.ref(other))

    def plan(self, serial: int, pieces, device_pieces=()) -> None:
        """A batch's order: the processes' pieces and the device's, each (lo, hi, make request)."""
        if self.pool is not None:
            self.pool.plan(serial, pieces)
        if self.lane is not None:
            self.lane.plan(serial, list(device_pieces))

    def take(self, serial: int, lo: int, hi: int, request, pin: bool):
        """Rows [lo, hi) decoded: from the pool when planned, else here."""
        if self._closed:
            raise DataError(f"the decode pool {self._closed}: its batches cannot be decoded")
        got = self.pool.take(serial, lo, hi, pin) if self.pool is not None else None
        return got if got is not None else _InProcess(self.pieces[request()])

    def decode_now(self, request):
        return self.pieces[request]

    def close(self, why: str = "was closed (TrainData.close)") -> None:
        """End the decode workers now (not at garbage collection, wherever that happens)."""
        self._closed = why
        if self.pool is not None:
            self.pool.close(why)
        if self.lane is not None:
            self.lane.close(why)


def _cut(lo: int, hi: int) -> List[Tuple[int, int]]:
    """Rows [lo, hi) as decode pieces of at most DECODE_PIECE_ROWS rows."""
    return [(p, min(p + DECODE_PIECE_ROWS, hi)) for p in range(lo, hi, DECODE_PIECE_ROWS)]


class EncodedBatch:
    """One rank's local batch: encoded image bytes (as the workers' pieces delivered them), int32
    token ids and each row's slot index; `chunk(lo, hi, device, dtype)` as HostBatch's."""

    def __init__(self, pieces: Sequence[tuple], epoch: int, decoder: ChunkDecoder,
                 mean=OPENAI_DATASET_MEAN, std=OPENAI_DATASET_STD, keep_rows: int = 0):
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
        self._kept = {}               # (lo, hi) -> (uint8 images, int64 texts) on the device
        self._asked = set()           # chunks requested once already
        self._planned = None          # the pieces planned with the pool, in order
        self.decode_wait_s = 0.0      # time chunk() waited for decoded pieces
        self.decode_skipped = 0       # images replaced because they did not decode (counted once)
        self._counted = set()
        self._serial = decoder.register(self)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def nbytes(self) -> int:
        """Host bytes this batch holds: encoded images, tokens and the row table."""
        return (sum(b.numel() for b in self._blobs) + self.texts.numel() * self.texts.element_size()
                + 8 * len(self.indices) + self._piece.nbytes + self._size.nbytes + self._start.nbytes)

    def _request(self, lo: int, hi: int):
        rows = zip(self._piece[lo:hi].tolist(), self._start[lo:hi].tolist(), self._size[lo:hi].tolist())
        return lo, [self._blobs[p][s:s + n].numpy().tobytes() for p, s, n in rows], self.epoch, self.indices[lo:hi]

    def schedule(self, passes: Sequence[Sequence[Tuple[int, int]]]) -> None:
        """The engine's order: `passes`, each a list of (lo, hi) chunks in the order it will ask
        for them (one pass for a batch of one chunk). Chunks kept between the passes
        (keep_rows) are decoded once."""
        self.decoder.announce(self, [list(map(tuple, chunks)) for chunks in passes])

    def _plan(self, passes, serial: Optional[int] = None) -> None:
        seen, pieces, on_device = set(), [], []
        for chunks in passes:
            for lo, hi in chunks:
                if (lo, hi) in seen and hi <= self.keep_rows:
                    continue  # served again from the device
                seen.add((lo, hi))
                cpu, gpu = self.decoder.split(lo, hi)
                pieces += cpu
                on_device += [gpu] if gpu else []
        if (pieces, on_device) == self._planned:
            return
        self._planned = (pieces, on_device)
        ref = weakref.ref(self)  # the pool must not keep a dropped batch alive

        def request(lo, hi):
            return lambda: None if ref() is None else ref()._request(lo, hi)
        self.decoder.plan(self._serial if serial is None else serial, [(lo, hi, request(lo, hi)) for lo, hi in pieces],
                          [(lo, hi, request(lo, hi)) for lo, hi in on_device])

    def decoded(self, lo: int, hi: int, device=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Rows [lo, hi): (uint8 images [n, 3, H, W], int64 texts), undecodable images (and
        their tokens) replaced; on `device` (default: the host). A dead or stalled decode worker
        is a DataError, and the pool stops."""
        try:
            return self._decoded(lo, hi, torch.device("cpu") if device is None else torch.device(device))
        except DecodePoolError as err:
            self.decoder.close(why=f"stopped when decoding local batch rows {lo}-{hi - 1} failed")
            raise DataError(f"decoding local batch rows {lo}-{hi - 1} failed: {err}") from None

    def _decoded(self, lo: int, hi: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        if self._planned is None:  # nobody announced an order: the engine's usual one
            chunks = [(a, min(a + hi - lo, len(self))) for a in range(0, len(self), hi - lo)]
            self.schedule([chunks] * ENGINE_PASSES)
        pieces, on_device = self.decoder.split(lo, hi)
        images, rows = None, {}
        if on_device is not None:  # first: the processes go on decoding their rows meanwhile
            a, b = on_device
            started = time.perf_counter()
            _, pixels, source, replaced = self.decoder.decode_on_device(self._serial, a, b,
                                                                        lambda: self._request(a, b))
            self.decode_wait_s += time.perf_counter() - started
            if not pieces and pixels.device == device:
                images = pixels
            else:
                images = torch.empty((hi - lo, *pixels.shape[1:]), dtype=torch.uint8, device=device)
                images[a - lo:b - lo].copy_(pixels, non_blocking=True)
            rows[a] = source + a
            self._count(a, replaced)
        for a, b in pieces:
            started = time.perf_counter()
            piece = self.decoder.take(self._serial, a, b, lambda a=a, b=b: self._request(a, b),
                                      pin=device.type == "cuda")
            self.decode_wait_s += time.perf_counter() - started
            if images is None:
                images = torch.empty((hi - lo, *piece.pixels.shape[1:]), dtype=torch.uint8, device=device)
            # From the pool's page-locked window: the copy overlaps compute. Each piece's slot is
            # given back as soon as its copy is done, so the pool never waits on a whole chunk.
            images[a - lo:b - lo].copy_(piece.pixels, non_blocking=True)
            copied = None
            if device.type == "cuda":
                copied = torch.cuda.Event()
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
        if (lo, hi) in self._kept:  # the second pass over a kept chunk: freed as it is served
            images, texts = self._kept.pop((lo, hi))
        else:
            images, texts = self.decoded(lo, hi, device)
            if hi <= self.keep_rows and (lo, hi) not in self._asked:
                self._kept[(lo, hi)] = (images, texts)
            self._asked.add((lo, hi))
        return normalize(images, self.mean, self.std, dtype), texts
