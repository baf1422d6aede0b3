"""Decoding encoded host batches with torchvision: nvJPEG on the GPU (`data.decoder: nvjpeg`, and
the GPU's share of `hybrid`), or torchvision.io's libjpeg-turbo on the CPU (`data.decoder:
torchvision`, in the decode processes); then open_clip's crop and resize with torch.

The crop is drawn exactly as the PIL path (decode_pieces.py) draws it, from the same per-slot
seed (CropGeometry); the pixels cannot be PIL's bit for bit (another IDCT and chroma upsampling,
torch's bicubic resize; how close: tests/data/decoding/test_encoded.py, docs/training.md). Images
that are not JPEG, and JPEGs the decoder refuses, are decoded by PIL, then cropped the same way; an
image neither can decode is replaced as in decode_pieces.py.

On the GPU a piece is one batched call of torchvision's decoder (nvJPEG; the hardware engine on
A100 and later, off the SMs) and one launch that crops and resizes all its images
(`resized_crops`, ops/resize.py): the launches of the GPU decoder's lane wait for slots in a
queue the towers keep full, so their number per piece, not their work, sets its pace. Both run on a stream of their own, which the consumer's
stream waits for: a chunk decodes while the towers still run the previous one.
"""
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import torch
from torchvision.transforms import CenterCrop, InterpolationMode, RandomResizedCrop, Resize
from torchvision.transforms import functional as F

from .crop_draws import crop_draws, random_resized_crop_params
from .decode_pieces import JPEG_MAGIC, DecodePieces, by_pil_where_missing, replacement_sources
from .device_lane import handed_over
from .nvimgcodec_decode import NvImageCodecJpegs
from .transforms import sample_seed

# Images per batched crop-and-resize: bounds its float32 work buffers (~64 x 3 x 400^2 x 4 B
# = 120 MiB for photos of 400 px), large enough that the products fill the GPU.
RESIZE_GROUP = 64
# Crops are zero-padded up to a multiple of this many pixels, per side (resized_crops).
PAD_TO = 32


@dataclass(frozen=True)
class Box:
    """One image's geometry: crop rows [top, top + height) and columns [left, left + width),
    resize that to out_h x out_w, keep the size x size window at (off_y, off_x)."""
    top: int
    left: int
    height: int
    width: int
    out_h: int
    out_w: int
    off_y: int
    off_x: int


class CropGeometry:
    """open_clip's geometric steps (RandomResizedCrop, or Resize + CenterCrop) as a Box per
    image, with the parameters the PIL pipeline would draw for the same slot."""

    def __init__(self, transform):
        steps = transform.transforms
        self.random_crop = next((s for s in steps if isinstance(s, RandomResizedCrop)), None)
        self.resize = next((s for s in steps if isinstance(s, Resize)), None)
        self.center = next((s for s in steps if isinstance(s, CenterCrop)), None)
        if self.random_crop is None and (self.resize is None or self.center is None):
            raise ValueError(f"no crop to reproduce on the device in {steps}")
        self.size = tuple(self.random_crop.size if self.random_crop is not None else self.center.size)
        if self.size[0] != self.size[1]:
            raise ValueError(f"a square output is expected, got {self.size}")

    def box(self, image: torch.Tensor, seed: int) -> Box:
        height, width = image.shape[-2:]
        s = self.size[0]
        if self.random_crop is not None:
            top, left, h, w = random_resized_crop_params(height, width, self.random_crop.scale,
                                                         self.random_crop.ratio, seed)
            return Box(top, left, h, w, s, s, 0, 0)
        out_h, out_w = _resized_size(height, width, self.resize.size, self.resize.max_size)
        # torchvision's CenterCrop rounds the offsets so; the resize never leaves less than a crop.
        return Box(0, 0, height, width, out_h, out_w, int(round((out_h - s) / 2.0)), int(round((out_w - s) / 2.0)))

    def boxes(self, images: Sequence[torch.Tensor], seeds: Sequence[int]) -> List[Box]:
        """box() for each image, the random crops drawn for all rows at once (crop_draws.py)
        where that equals torch's draws in this process, else row by row."""
        if self.random_crop is None:
            return [self.box(image, seed) for image, seed in zip(images, seeds)]
        s = self.size[0]
        drawn = crop_draws([im.shape[-2] for im in images], [im.shape[-1] for im in images], seeds,
                           self.random_crop.scale, self.random_crop.ratio)
        if drawn is None:
            return [self.box(image, seed) for image, seed in zip(images, seeds)]
        return [Box(top, left, h, w, s, s, 0, 0) for top, left, h, w in drawn]


def _resized_size(height: int, width: int, size, max_size) -> tuple:
    """torchvision's Resize output size for a tensor of height x width."""
    if isinstance(size, int) or len(size) == 1:
        requested = size if isinstance(size, int) else size[0]
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = requested, int(requested * long / short)
        if max_size is not None and new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
        return (new_long, new_short) if width <= height else (new_short, new_long)
    return tuple(size)


class DeviceCrops:
    """The geometry applied to one uint8 [3, h, w] tensor at a time, with torchvision's own
    resize (the decode processes' `torchvision` decoder, on the CPU)."""

    def __init__(self, transform):
        self.geometry = CropGeometry(transform)

    def __call__(self, image: torch.Tensor, seed: int) -> torch.Tensor:
        b, s = self.geometry.box(image, seed), self.geometry.size[0]
        image = F.resized_crop(image, b.top, b.left, b.height, b.width, [b.out_h, b.out_w],
                               interpolation=InterpolationMode.BICUBIC, antialias=True)
        return image[:, b.off_y:b.off_y + s, b.off_x:b.off_x + s]


def _bicubic(x: torch.Tensor) -> torch.Tensor:
    """The antialiased bicubic filter of torch and PIL (a = -0.5)."""
    a, x = -0.5, x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def resample_weights(in_len: torch.Tensor, out_len: torch.Tensor, offset: torch.Tensor, size: int,
                     max_in: int) -> torch.Tensor:
    """float64 [n, size, max_in]: row t of image i weighs the input samples for output sample
    offset[i] + t of an antialiased bicubic resize of in_len[i] samples to out_len[i], zero
    past in_len[i]. The taps and their normalisation are torch's `interpolate(mode="bicubic",
    antialias=True)` (aten's _compute_indices_weights_aa), which follows PIL's resample."""
    device = in_len.device
    scale = (in_len / out_len)[:, None]                                   # [n, 1]
    support = torch.where(scale >= 1, 2 * scale, torch.full_like(scale, 2.0))
    inv = torch.where(scale >= 1, 1 / scale, torch.ones_like(scale))
    center = scale * (offset[:, None] + torch.arange(size, device=device, dtype=scale.dtype) + 0.5)  # [n, size]
    lo = torch.clamp(torch.trunc(center - support + 0.5), min=0)
    hi = torch.minimum(torch.trunc(center + support + 0.5), in_len[:, None])
    j = torch.arange(max_in, device=device, dtype=scale.dtype)
    weights = _bicubic((j - center[..., None] + 0.5) * inv[..., None])  # [n, size, max_in]
    weights = torch.where((j >= lo[..., None]) & (j < hi[..., None]), weights, torch.zeros_like(weights))
    total = weights.sum(-1, keepdim=True)
    return torch.where(total != 0, weights / torch.where(total != 0, total, torch.ones_like(total)), weights)


def resized_crops(images: Sequence[torch.Tensor], boxes: Sequence[Box], size: int) -> torch.Tensor:
    """uint8 [n, 3, size, size]: each uint8 [3, h, w] image cropped and resized by its box.
    On CUDA one kernel launch for all (ops/resize.py: the lane's launches wait behind the
    towers' in the GPU's queue); on the CPU `resized_crops_torch`, which is also its reference."""
    if images and images[0].is_cuda:
        from ...ops.resize import resized_crops_kernel  # Triton: not imported by the CPU's decode processes
        return resized_crops_kernel(images, boxes, size)
    return resized_crops_torch(images, boxes, size)


def resized_crops_torch(images: Sequence[torch.Tensor], boxes: Sequence[Box], size: int) -> torch.Tensor:
    """resized_crops in torch ops. Images whose crops round up to the same PAD_TO multiple go
    together, up to RESIZE_GROUP at a time: the crops are gathered into one zero-padded float32
    tensor (one gather), then out = W_rows @ crop @ W_cols^T with resample_weights (two batched
    products). The padding depends on an image's own crop only, so its pixels do not depend on
    which images share its piece (a hybrid chunk's rows equal the nvjpeg decoder's)."""
    device = images[0].device
    out = torch.empty((len(images), 3, size, size), dtype=torch.uint8, device=device)
    padded = [(-(-b.height // PAD_TO) * PAD_TO, -(-b.width // PAD_TO) * PAD_TO) for b in boxes]
    groups = {}
    for i, shape in enumerate(padded):
        groups.setdefault(shape, []).append(i)
    for (max_h, max_w), members in groups.items():
        for g in range(0, len(members), RESIZE_GROUP):
            at = members[g:g + RESIZE_GROUP]
            resized = _resize_group([images[i] for i in at], [boxes[i] for i in at], size, max_h, max_w)
            out[torch.tensor(at, device=device)] = resized
    return out


def _resize_group(images, boxes, size: int, max_h: int, max_w: int) -> torch.Tensor:
    device = images[0].device
    flat = torch.cat([im.reshape(-1) for im in images])
    starts, at = [], 0
    for im in images:  # where each image starts in `flat`
        starts.append(at)
        at += im.numel()
    # Per image: its start, plane and row sizes, its box; sent to the device at once.
    meta = torch.tensor([[st, im.shape[-2] * im.shape[-1], im.shape[-1], b.top, b.left, b.height, b.width,
                          b.out_h, b.out_w, b.off_y, b.off_x] for st, im, b in zip(starts, images, boxes)],
                        dtype=torch.int64).to(device, non_blocking=True)
    start, plane, width, top, left, ch, cw, out_h, out_w, off_y, off_x = meta.unbind(1)
    y = torch.arange(max_h, device=device)[:, None]
    x = torch.arange(max_w, device=device)[None, :]
    c = torch.arange(3, device=device)[:, None, None]
    v = lambda t: t[:, None, None, None]  # noqa: E731 - per image, broadcast over (c, y, x)
    inside = (y < v(ch)) & (x < v(cw))
    index = torch.where(inside, v(start) + c * v(plane) + (v(top) + y) * v(width) + v(left) + x, 0)
    crops = torch.where(inside, flat[index].float(), 0.0)
    rows = resample_weights(ch.double(), out_h.double(), off_y.double(), size, max_h).float()
    cols = resample_weights(cw.double(), out_w.double(), off_x.double(), size, max_w).float()
    resized = rows[:, None] @ (crops @ cols[:, None].transpose(-1, -2))
    return resized.round_().clamp_(0, 255).to(torch.uint8)


def decode_jpegs(blobs: List[bytes], device) -> List[Optional[torch.Tensor]]:
    """uint8 [3, h, w] per blob on `device` (None: undecodable): JPEGs in one batched call of
    the device's decoder, the rest (and any JPEG it refuses) by PIL on the host. On CUDA,
    torchvision decodes on its own stream and makes the current stream wait for it."""
    from torchvision.io import ImageReadMode, decode_jpeg
    out: List[Optional[torch.Tensor]] = [None] * len(blobs)
    jpegs = [i for i, b in enumerate(blobs) if b[:2] == JPEG_MAGIC]
    if jpegs:
        data = [torch.frombuffer(bytearray(blobs[i]), dtype=torch.uint8) for i in jpegs]
        try:
            decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        except RuntimeError:  # one bad JPEG fails the batch: decode them one by one
            decoded = []
            for d in data:
                try:
                    decoded.append(decode_jpeg(d, mode=ImageReadMode.RGB, device=device))
                except RuntimeError:
                    decoded.append(None)
        for i, image in zip(jpegs, decoded):
            out[i] = image
    return by_pil_where_missing(blobs, out, device)


class DevicePieces(DecodePieces):
    """DecodePieces decoding with torchvision, one image at a time after the decode (the decode
    processes' `torchvision` decoder, on the CPU)."""

    def __init__(self, transform, seed: int, device="cpu"):
        super().__init__(transform, seed)
        self.crops, self.device = DeviceCrops(transform), torch.device(device)

    def images(self, blobs, epoch: int, indices) -> List[Optional[torch.Tensor]]:
        return [None if image is None else self.crops(image, sample_seed(self.seed, epoch, index))
                for image, index in zip(decode_jpegs(blobs, self.device), indices)]


def jpeg_decoder(library: str, device: torch.device) -> Callable:
    """`blobs -> [uint8 [3, h, w] or None]` on `device` with the GPU decoder's JPEG library
    (data.gpu_jpeg_library): torchvision's nvJPEG binding (decode_jpegs) or NVIDIA's nvImageCodec
    (nvimgcodec_decode.py, the gpu-decode extra). On the CPU each uses its libjpeg-turbo."""
    if library == "torchvision":
        return lambda blobs: decode_jpegs(blobs, device)
    if library == "nvimgcodec":
        return NvImageCodecJpegs(device)
    raise ValueError(f"data.gpu_jpeg_library must be torchvision or nvimgcodec, got {library!r}")


class BatchedDevicePieces(DecodePieces):
    """A request -> DecodePieces' result with the pixels on `device`: the whole piece decoded in
    one batched call of `library` (jpeg_decoder) and cropped in batched products (nvJPEG on
    CUDA; on the CPU the same code with the library's CPU decoder, which is what the CPU tests run).
    `jpegs`: another `blobs -> images` decoder in the library's place (a benchmark's).
    `stream_priority`: the decoding stream's CUDA priority (lower is higher; 0: the towers'), so
    that a benchmark can ask whether its kernels waiting behind the towers' set its pace."""

    def __init__(self, transform, seed: int, device, library: str = "torchvision", jpegs: Optional[Callable] = None,
                 stream_priority: int = 0):
        super().__init__(transform, seed)
        self.geometry, self.device = CropGeometry(transform), torch.device(device)
        self.jpegs = jpegs or jpeg_decoder(library, self.device)
        self.stream = (torch.cuda.Stream(self.device, priority=stream_priority) if self.device.type == "cuda"
                       else None)

    def decode(self, request):
        """(the piece, a CUDA event recorded behind its work, or None on the CPU). On CUDA the
        piece is decoded on this decoder's own stream, which waits for nothing queued on the
        consumer's: it decodes while the towers still run (device_lane.handed_over gives it
        to the consumer's stream)."""
        if self.stream is None:
            return self._decode(*request), None
        with torch.cuda.stream(self.stream):
            piece = self._decode(*request)
            event = torch.cuda.Event()
            event.record(self.stream)
        return piece, event

    def __getitem__(self, request):
        return handed_over(self.decode(request))

    def _decode(self, row0, blobs, epoch, indices):
        images = self.jpegs(blobs)
        source = replacement_sources([image is not None for image in images], row0)
        usable = [r for r, image in enumerate(images) if image is not None]
        boxes = self.geometry.boxes([images[r] for r in usable],
                                    [sample_seed(self.seed, epoch, indices[r]) for r in usable])
        pixels = resized_crops([images[r] for r in usable], boxes, self.geometry.size[0])
        position = {r: p for p, r in enumerate(usable)}
        if len(usable) < len(images):
            pixels = pixels[torch.tensor([position[s] for s in source], device=self.device)]
        return row0, pixels, torch.tensor(source, dtype=torch.int64), len(images) - len(usable)
