"""RandomResizedCrop's draws for a whole piece of rows at once, equal to torch's generator's.

The PIL path crops each sample under torch's CPU generator seeded with the sample's own seed
(transforms.py), and the GPU decoder must draw the same crops. Drawn one row at a time
through `torch.Generator` (random_resized_crop_params) that is ~20 small torch
calls a row: 0.15 s per 1,024 rows alone and 0.18 s beside the training loop, the largest part
of the GPU decoder's host time once its resize became one launch (launch/probe_lane.py).

Here the same numbers come from numpy, vectorised over the rows:
- torch's CPU generator is MT19937 seeded with the low 32 bits of the seed (init_genrand), and a
  crop needs only its first 2 x attempts + 2 outputs, which depend on state words 0..k and
  397..397+k of the initial state: the seeding recurrence runs to word 397 + k for all rows at
  once, then the first outputs are twisted and tempered directly;
- `uniform_(lo, hi)` on a float32 tensor is x * (hi - lo) + lo with x the output's low 24 bits
  over 2^24 and one rounding to float32 (torch's kernel is contracted to a fused multiply-add);
- `randint(0, n)` is output % n (n < 2^32); the aspect's exp is torch.exp on float32, as torch's.
`verified()` checks all of that against torch's own draws for a few hundred rows once per
process, so a torch whose kernels round otherwise gets the row-by-row draws instead of wrong crops.
"""
import math
from functools import lru_cache
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

_M32 = np.uint64(0xFFFFFFFF)
ATTEMPTS = 10  # torchvision's RandomResizedCrop.get_params


def mt19937_first_outputs(seeds: Sequence[int], count: int) -> np.ndarray:
    """uint64 [count, rows]: the first `count` 32-bit outputs of MT19937 seeded as torch seeds
    its CPU generator (`manual_seed(seed)`), one column per seed."""
    words = np.empty((397 + count + 1, len(seeds)), dtype=np.uint64)
    words[0] = np.fromiter((s & 0xFFFFFFFF for s in seeds), dtype=np.uint64, count=len(seeds))
    for j in range(1, words.shape[0]):
        p = words[j - 1]
        words[j] = (np.uint64(1812433253) * (p ^ (p >> np.uint64(30))) + np.uint64(j)) & _M32
    u, v, far = words[:count], words[1:count + 1], words[397:397 + count]
    y = (u & np.uint64(0x80000000)) | (v & np.uint64(0x7FFFFFFF))
    y = far ^ (y >> np.uint64(1)) ^ np.where((v & np.uint64(1)) != 0, np.uint64(0x9908B0DF), np.uint64(0))
    y ^= y >> np.uint64(11)
    y ^= (y << np.uint64(7)) & np.uint64(0x9D2C5680)
    y ^= (y << np.uint64(15)) & np.uint64(0xEFC60000)
    y ^= y >> np.uint64(18)
    return y & _M32


def _uniform(raw: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """float32 values of torch's `uniform_(lo, hi)` for raw outputs `raw`."""
    x = (raw & np.uint64(0xFFFFFF)).astype(np.float64) / 2.0 ** 24
    f, t = np.float32(lo), np.float32(hi)
    # In float64 the product is exact (24 x 24 bits) and the one rounding is to float32: an FMA's.
    return (x * np.float64(t - f) + np.float64(f)).astype(np.float32)


def central_crop(height: int, width: int, ratio) -> Tuple[int, int, int, int]:
    """RandomResizedCrop's crop where none of its draws fits: the largest central one within `ratio`."""
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def random_resized_crop_params(height: int, width: int, scale, ratio, seed: int) -> tuple:
    """torchvision's RandomResizedCrop.get_params, step for step, drawing from a generator of its
    own seeded with `seed`: the draws of the PIL path, which runs the transform under this seed
    on torch's global generator (get_params is its first draw), without touching that global
    generator, which the GPU decoder's thread must not share with the training loop."""
    generator = torch.Generator().manual_seed(seed)
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(ATTEMPTS):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=generator)).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,), generator=generator).item()
            j = torch.randint(0, width - w + 1, size=(1,), generator=generator).item()
            return i, j, h, w
    return central_crop(height, width, ratio)  # no draw fitted


def random_resized_crops(heights: Sequence[int], widths: Sequence[int], seeds: Sequence[int], scale,
                         ratio) -> List[Tuple[int, int, int, int]]:
    """(top, left, height, width) per row: RandomResizedCrop.get_params(image of heights[r] x
    widths[r], scale, ratio) under torch's generator seeded with seeds[r]."""
    if not len(seeds):
        return []
    raw = mt19937_first_outputs(seeds, 2 * ATTEMPTS + 2)
    H, W = np.asarray(heights, dtype=np.int64), np.asarray(widths, dtype=np.int64)
    log_ratio = torch.log(torch.tensor(ratio))
    area_share = _uniform(raw[0:2 * ATTEMPTS:2], scale[0], scale[1]).astype(np.float64)  # [attempt, row]
    log_aspect = _uniform(raw[1:2 * ATTEMPTS:2], float(log_ratio[0]), float(log_ratio[1]))
    aspect = torch.exp(torch.from_numpy(log_aspect)).numpy().astype(np.float64)
    target = (H * W).astype(np.float64) * area_share
    w = np.rint(np.sqrt(target * aspect)).astype(np.int64)  # Python's round: half to even, as rint
    h = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    fits = (w > 0) & (w <= W) & (h > 0) & (h <= H)
    first = np.where(fits.any(0), fits.argmax(0), -1)
    out = []
    for r, a in enumerate(first.tolist()):
        height, width = int(H[r]), int(W[r])
        if a < 0:  # no draw fitted: the central crop
            out.append(central_crop(height, width, ratio))
            continue
        ch, cw = int(h[a, r]), int(w[a, r])
        # the two randint draws follow the accepted attempt's two uniforms
        out.append((int(raw[2 * a + 2, r]) % (height - ch + 1), int(raw[2 * a + 3, r]) % (width - cw + 1), ch, cw))
    return out


@lru_cache(maxsize=None)
def verified(scale: Tuple[float, float], ratio: Tuple[float, float]) -> bool:
    """Whether random_resized_crops equals torch's row-by-row draws in this process's torch, on
    rows of many shapes (draws accepted at once, after rejections, and none)."""
    rng = np.random.default_rng(0)
    heights = [int(v) for v in rng.integers(1, 800, 384)] + [1, 2, 3, 5000, 7]
    widths = [int(v) for v in rng.integers(1, 800, 384)] + [1, 900, 2, 5, 7]
    seeds = [int(s) for s in np.random.SeedSequence(20261126).generate_state(len(heights), np.uint64)]
    got = random_resized_crops(heights, widths, seeds, scale, ratio)
    return all(g == tuple(random_resized_crop_params(h, w, scale, ratio, s))
               for g, h, w, s in zip(got, heights, widths, seeds))


def crop_draws(heights, widths, seeds, scale, ratio) -> Optional[List[Tuple[int, int, int, int]]]:
    """random_resized_crops where verified() holds for these parameters, else None (the caller
    draws row by row)."""
    key = (tuple(float(v) for v in scale), tuple(float(v) for v in ratio))
    return random_resized_crops(heights, widths, seeds, *key) if verified(*key) else None

