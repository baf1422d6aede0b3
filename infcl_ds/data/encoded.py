"""Local batches held as the shards store them (a JPEG of ~10-30 KB, not 147 KB of 224 px
pixels), decoded chunk by chunk in each of the engine's two passes by a pool of processes.

The engine asks for chunks in a fixed order (every chunk without grad, then with grad): a batch
queues that order with the pool at its first request, and decodes a request out of that order
in the calling process (slower, same pixels). Both passes see bit-identical pixels: the same
bytes, augmented under the same per-slot seed (transforms.transform_image).
"""
import time
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from torch.utils.data import DataLoader, Dataset

from .batch import normalize
from .errors import DataError
from .sampler import SettableSampler, start_workers, stop_workers
from .samples import SkipSample, decode_image, load_or_replace
from .transforms import transform_image

# Rows per decode task: small enough that a chunk spreads over the pool and the first piece is
# ready soon, large enough that a task's overhead (pickling its bytes, one result) is amortised.
DECODE_PIECE_ROWS = 32
# Decoded pieces in flight per decode worker (DataLoader's prefetch_factor).
DECODE_PREFETCH = 4
# Seconds a rank waits for one decoded piece before it gives up with an error naming the rows.
DECODE_TIMEOUT_S = 600
# Passes of the engine over each local batch: without grad, then with grad (engine/step.py).
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
        usable = [r for r, image in enumerate(images) if image is not None]
        if not usable:
            raise DataError(f"local batch rows {row0}-{row0 + len(images) - 1}: no image of these "
                            f"{len(images)} decodes")
        source = [r if images[r] is not None else next((u for u in usable if u > r), usable[0])
                  for r in range(len(images))]
        pixels = torch.stack([images[s] for s in source])
        return row0, pixels, torch.tensor(source, dtype=torch.int64), len(images) - len(usable)


class ChunkDecoder:
    """A rank's decode pool: `workers` processes (0: decode in the calling process), started
    here, before any batch exists (sampler.SettableSampler says why), and kept for the run
    (DataLoader's persistent workers, which also turn a worker's death or a stall past
    DECODE_TIMEOUT_S into an error in the rank). `decoder`:
    "pil" (open_clip's pixels exactly) or "torchvision" (torchvision.io's decoder and torch's
    resize on `device`, the same crops: data.decoder)."""

    def __init__(self, transform, seed: int, workers: int, decoder: str = "pil", device="cpu"):
        if decoder == "pil":
            self.pieces = DecodePieces(transform, seed)
        elif decoder == "torchvision":
            from .device_decode import DevicePieces  # it builds on this module
            self.pieces = DevicePieces(transform, seed, device)
        else:
            raise DataError(f"data.decoder must be 'pil' or 'torchvision', got {decoder!r}")
        self._sampler = SettableSampler()
        self._loader, self._closed = None, None  # _closed: why the pool ended, once it has
        if workers > 0:
            self._loader = DataLoader(self.pieces, batch_size=None, sampler=self._sampler, num_workers=workers,
                                      persistent_workers=True, prefetch_factor=DECODE_PREFETCH,
                                      pin_memory=torch.cuda.is_available(), timeout=DECODE_TIMEOUT_S)
            start_workers(self._loader)

    def stream(self, requests: Iterator) -> Iterator:
        """Decoded pieces for `requests`, in order, decoded ahead by the pool. Starting a new
        stream abandons the previous one."""
        if self._closed:
            raise DataError(f"the decode pool {self._closed}: its batches cannot be decoded")
        if self._loader is None:
            return (self.pieces[request] for request in requests)
        self._sampler.requests = requests
        return iter(self._loader)

    def decode_now(self, request):
        return self.pieces[request]

    def close(self, why: str = "was closed (TrainData.close)") -> None:
        """End the decode workers (sampler.stop_workers says why not at garbage collection).
        Also after a worker died: the pool cannot go on, and torch's SIGCHLD handler would
        otherwise report each dead worker again, as a RuntimeError from wherever the main
        thread happens to be when a later signal comes (a checkpoint's write, the shutdown)."""
        self._closed = why
        if self._loader is not None:
            stop_workers(self._loader)


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
        self._plan: Optional[List[Tuple[int, int]]] = None  # the pieces the stream will deliver, in order
        self._stream: Optional[Iterator] = None
        # Chunks within the first `keep_rows` rows stay decoded on their device from the first
        # pass to the second (data.keep_decoded_gib): decoded once per step instead of twice.
        self.keep_rows = keep_rows
        self._kept = {}               # (lo, hi) -> (uint8 images, int64 texts) on the device
        self._asked = set()           # chunks requested once already
        self.decode_wait_s = 0.0      # time chunk() waited for decoded pieces
        self.decode_skipped = 0       # images replaced because they did not decode (counted once)
        self._counted = set()

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def nbytes(self) -> int:
        """Host bytes this batch holds: encoded images, tokens and the row tables."""
        return (sum(b.numel() for b in self._blobs) + self.texts.numel() * self.texts.element_size()
                + 8 * len(self.indices) + self._piece.nbytes + self._size.nbytes + self._start.nbytes)

    def _request(self, lo: int, hi: int):
        rows = zip(self._piece[lo:hi].tolist(), self._start[lo:hi].tolist(), self._size[lo:hi].tolist())
        return lo, [self._blobs[p][s:s + n].numpy().tobytes() for p, s, n in rows], self.epoch, self.indices[lo:hi]

    def _start_stream(self, chunk_rows: int) -> None:
        """Queue every piece of the engine's order of requests: each pass, every chunk of
        `chunk_rows` rows in order, each chunk cut into pieces of DECODE_PIECE_ROWS."""
        n = len(self)
        chunks = [(lo, min(lo + chunk_rows, n)) for lo in range(0, n, chunk_rows)]
        first = [p for lo, hi in chunks for p in _cut(lo, hi)]
        again = [p for lo, hi in chunks if hi > self.keep_rows for p in _cut(lo, hi)]  # kept chunks: decoded once
        self._plan = first + again * (ENGINE_PASSES - 1)
        self._stream = self.decoder.stream(self._request(lo, hi) for lo, hi in list(self._plan))

    def _pieces(self, lo: int, hi: int) -> List[tuple]:
        if self._plan is None:
            self._start_stream(hi - lo)
        wanted = _cut(lo, hi)
        if self._plan[:len(wanted)] != wanted:  # not the order queued: decode here, same pixels
            return [self.decoder.decode_now(self._request(a, b)) for a, b in wanted]
        del self._plan[:len(wanted)]
        started = time.perf_counter()
        pieces = [next(self._stream) for _ in wanted]
        self.decode_wait_s += time.perf_counter() - started
        return pieces

    def decoded(self, lo: int, hi: int, device=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Rows [lo, hi): (uint8 images [n, 3, H, W], int64 texts), undecodable images (and
        their tokens) replaced; on `device` (default: the host). A dead or stalled decode worker
        is a DataError, and the pool stops (ChunkDecoder.close says why)."""
        try:
            return self._decoded(lo, hi, device)
        except DataError:  # unusable data, raised in a worker: its own message
            raise
        # torch's RuntimeError ("DataLoader worker ... killed", "DataLoader timed out"), raised by
        # the pool's iterator or by its SIGCHLD handler anywhere in this call; or, when a worker
        # died while handing a piece over, the broken connection that carried its descriptor.
        except (RuntimeError, StopIteration, OSError, EOFError) as err:
            self.decoder.close(why=f"stopped when decoding local batch rows {lo}-{hi - 1} failed")
            raise DataError(f"decoding local batch rows {lo}-{hi - 1} failed: {err}") from err

    def _decoded(self, lo: int, hi: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
        images, rows = [], []
        for row0, pixels, source, replaced in self._pieces(lo, hi):
            images.append(pixels if device is None else pixels.to(device, non_blocking=True))
            rows.append(source + row0)
            if replaced and row0 not in self._counted:
                self._counted.add(row0)
                self.decode_skipped += replaced
        texts = self.texts[torch.cat(rows)].to(torch.int64)
        texts = texts if device is None else texts.to(device, non_blocking=True)
        return (images[0] if len(images) == 1 else torch.cat(images)), texts

    def chunk(self, lo: int, hi: int, device, dtype=torch.float32):
        """Rows [lo, hi) on `device`: (normalised images in `dtype`, int64 texts). Each decoded
        piece is copied as it arrives (page-locked by the pool: the copies overlap compute)."""
        if (lo, hi) in self._kept:  # the second pass over a kept chunk: freed as it is served
            images, texts = self._kept.pop((lo, hi))
        else:
            images, texts = self.decoded(lo, hi, device)
            if hi <= self.keep_rows and (lo, hi) not in self._asked:
                self._kept[(lo, hi)] = (images, texts)
            self._asked.add((lo, hi))
        return normalize(images, self.mean, self.std, dtype), texts
