"""Crop-and-resize of a whole piece of decoded images in one launch: the GPU decoder's crops
(data/decoding/device_decode.py), open_clip's antialiased bicubic resize of each image's crop box.

Why a kernel: the GPU decoder's lane shares the GPU's launch queue with the towers, which keep it
full. Each of its launches then waits for a slot, about a tower kernel's time: a crop-and-resize
built from torch ops (a gather and two batched products per group of crop sizes, ~7 launches a
row) spends most of its time waiting behind the towers' kernels (launch/probe_lane.py measures
it beside a thread that keeps the queue full). One launch per piece waits once.

What it computes is torch's `interpolate(mode="bicubic", antialias=True)` of each crop (aten's
_compute_indices_weights_aa, which follows PIL's resample), separably: for output row y and
column x of image i,

    out[y, x] = sum_r wy[y, r] * sum_s wx[x, s] * crop[r, s]

where wy (wx) are the normalised bicubic taps (a = -0.5) of output sample offset + y of a resize
from the crop's height (width) to out_h (out_w), stretched by the scale when shrinking. The taps
are computed in float64 as torch computes them, the sums in float32 over the taps alone (no
padding), then rounded half to even and clamped: an image's pixels depend on its own box only,
never on the images beside it in the piece. Against torch's resize of the same crop: within one
level, rounding only (tests/ops/test_resize.py).

A program computes BLOCK_Y output rows of one channel of one image; its loops run over the
image's own tap counts (a few for a photo shrunk to 224 px; more for a large one).
"""
import math
from typing import Sequence

import torch
import triton
import triton.language as tl

# One row of `meta` per image, int64, in this order.
META_COLUMNS = ("start", "plane", "width", "top", "left", "height", "crop_width", "out_h", "out_w",
                "off_y", "off_x", "taps_y", "taps_x")
BLOCK_Y = 16


def max_taps(in_len: int, out_len: int) -> int:
    """An upper bound of the taps one output sample reads along an axis (the kernel's loop)."""
    scale = in_len / out_len
    support = 2.0 * scale if scale >= 1.0 else 2.0
    return int(math.ceil(2.0 * support)) + 2


@triton.jit
def _bicubic(x):
    """The antialiased bicubic filter of torch and PIL (a = -0.5) at |x|."""
    a = -0.5
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return tl.where(x < 1.0, near, tl.where(x < 2.0, far, 0.0))


@triton.jit
def _axis(t, offset, in_len, out_len):
    """For output samples t along one axis: the first input sample read, one past the last, the
    window's centre and the filter's stretch (float64, as torch computes them)."""
    scale = in_len.to(tl.float64) / out_len.to(tl.float64)
    support = tl.where(scale >= 1.0, 2.0 * scale, 2.0)
    inv = tl.where(scale >= 1.0, 1.0 / scale, 1.0)
    center = scale * ((offset + t).to(tl.float64) + 0.5)
    # torch truncates; for the values clamped at 0 below, floor and truncation agree.
    lo = tl.maximum(tl.floor(center - support + 0.5), 0.0)
    hi = tl.minimum(tl.floor(center + support + 0.5), in_len.to(tl.float64))
    return lo, hi, center, inv


@triton.jit
def _tap(k, lo, hi, center, inv):
    """Tap k of each sample's window: (input index, unnormalised weight, inside the window)."""
    j = lo + k
    inside = j < hi
    return j, tl.where(inside, _bicubic(tl.abs((j - center + 0.5) * inv)), 0.0), inside


@triton.jit
def _total(lo, hi, center, inv, taps):
    total = tl.zeros_like(center)
    for k in range(0, taps):
        _, w, _ = _tap(k, lo, hi, center, inv)
        total += w
    return tl.where(total != 0.0, total, 1.0)  # torch leaves a window of zero weights as it is


@triton.jit
def _round_half_even(x):
    f = tl.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, tl.where(odd, f + 1.0, f)))


@triton.jit
def _resized_crop_kernel(src, meta, out, SIZE: tl.constexpr, COLUMNS: tl.constexpr,
                         BLOCK_Y: tl.constexpr, BLOCK_X: tl.constexpr):
    image = tl.program_id(0)
    channel = tl.program_id(1)
    m = meta + image * COLUMNS
    start, plane, width = tl.load(m + 0), tl.load(m + 1), tl.load(m + 2)
    top, left, height, crop_width = tl.load(m + 3), tl.load(m + 4), tl.load(m + 5), tl.load(m + 6)
    out_h, out_w, off_y, off_x = tl.load(m + 7), tl.load(m + 8), tl.load(m + 9), tl.load(m + 10)
    taps_y, taps_x = tl.load(m + 11), tl.load(m + 12)

    ys = tl.program_id(2) * BLOCK_Y + tl.arange(0, BLOCK_Y)
    xs = tl.arange(0, BLOCK_X)
    y_ok, x_ok = ys < SIZE, xs < SIZE
    lo_y, hi_y, center_y, inv_y = _axis(ys, off_y, height, out_h)
    lo_x, hi_x, center_x, inv_x = _axis(xs, off_x, crop_width, out_w)
    total_y = _total(lo_y, hi_y, center_y, inv_y, taps_y)
    total_x = _total(lo_x, hi_x, center_x, inv_x, taps_x)

    crop = src + start + channel * plane + top * width + left
    acc = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.float32)
    for kr in range(0, taps_y):
        r, wr, r_in = _tap(kr, lo_y, hi_y, center_y, inv_y)
        wr = (wr / total_y).to(tl.float32)
        row = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.float32)
        for ks in range(0, taps_x):
            s, wc, s_in = _tap(ks, lo_x, hi_x, center_x, inv_x)
            wc = (wc / total_x).to(tl.float32)
            ok = (r_in & y_ok)[:, None] & (s_in & x_ok)[None, :]
            at = r.to(tl.int64)[:, None] * width + s.to(tl.int64)[None, :]
            pixels = tl.load(crop + at, mask=ok, other=0).to(tl.float32)
            row += pixels * wc[None, :]
        acc += row * wr[:, None]
    value = _round_half_even(tl.minimum(tl.maximum(acc, 0.0), 255.0))
    target = out + (image * 3 + channel) * SIZE * SIZE + ys[:, None] * SIZE + xs[None, :]
    tl.store(target, value.to(tl.uint8), mask=y_ok[:, None] & x_ok[None, :])


def crop_meta(images: Sequence[torch.Tensor], boxes: Sequence, device) -> tuple:
    """(flat uint8 pixels of all images, int64 [n, len(META_COLUMNS)] rows) on `device`, for
    `resized_crops_kernel`. `boxes` have the fields of data/device_decode.Box.

    The kernel indexes each image as a C-order [3, h, w] block of the flat buffer, and the
    buffer is always that whatever the images' strides (channels-last, sliced, offset):
    reshape(-1) flattens an image in C order (copying it only when it is not contiguous) and
    torch.cat writes the images one after another, so the kernel assumes no layout."""
    rows, at = [], 0
    for im, b in zip(images, boxes):
        if im.dim() != 3 or im.shape[0] != 3 or im.dtype != torch.uint8:
            raise ValueError(f"resized_crops: expected uint8 [3, h, w] images, got {im.dtype} {tuple(im.shape)}")
        h, w = im.shape[-2:]
        if not (0 <= b.top and b.top + b.height <= h and 0 <= b.left and b.left + b.width <= w
                and b.height > 0 and b.width > 0):
            raise ValueError(f"resized_crops: box {b} is not inside an image of {h} x {w}")
        rows.append([at, h * w, w, b.top, b.left, b.height, b.width, b.out_h, b.out_w, b.off_y, b.off_x,
                     max_taps(b.height, b.out_h), max_taps(b.width, b.out_w)])
        at += im.numel()
    flat = torch.cat([im.reshape(-1) for im in images])
    return flat, torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)


def resized_crops_kernel(images: Sequence[torch.Tensor], boxes: Sequence, size: int) -> torch.Tensor:
    """uint8 [n, 3, size, size]: each uint8 [3, h, w] image (all on one device, any strides:
    crop_meta) cropped to its box and resized, in one launch. None at all: an empty tensor on
    the CPU."""
    if not images:
        return torch.empty((0, 3, size, size), dtype=torch.uint8)
    device = images[0].device
    out = torch.empty((len(images), 3, size, size), dtype=torch.uint8, device=device)
    flat, meta = crop_meta(images, boxes, device)
    grid = (len(images), 3, triton.cdiv(size, BLOCK_Y))
    _resized_crop_kernel[grid](flat, meta, out, SIZE=size, COLUMNS=len(META_COLUMNS), BLOCK_Y=BLOCK_Y,
                               BLOCK_X=triton.next_power_of_2(size))
    return out
