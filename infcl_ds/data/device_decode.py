"""Decoding encoded host batches with torchvision: nvJPEG on the GPU (`infcl-ds bench data`; not
a trainer option yet), or torchvision.io's libjpeg-turbo on the CPU (`data.decoder: torchvision`,
in the decode processes); then open_clip's crop and resize with torch on the same device.

The crop is drawn exactly as the PIL path (data/encoded.py) draws it, from the same per-slot
seed; the pixels cannot be PIL's bit for bit (another IDCT and chroma upsampling, torch's bicubic
resize; how close: tests/test_encoded.py, docs/benchmarks.md). Images that are not JPEG, and
JPEGs the decoder refuses, are decoded by PIL, then cropped the same way; an image neither can
decode is replaced as in data/encoded.py.
"""
from typing import List, Optional

import torch
from torchvision.transforms import CenterCrop, InterpolationMode, RandomResizedCrop, Resize
from torchvision.transforms import functional as F

from .encoded import ChunkDecoder, DecodePieces
from .samples import SkipSample, decode_image
from .transforms import sample_seed, seeded_cpu_generator

JPEG_MAGIC = b"\xff\xd8"


class DeviceCrops:
    """open_clip's geometric steps (RandomResizedCrop, or Resize + CenterCrop) applied to uint8
    [3, h, w] tensors on any device, with the parameters the PIL pipeline would draw."""

    def __init__(self, transform):
        steps = transform.transforms
        self.random_crop = next((s for s in steps if isinstance(s, RandomResizedCrop)), None)
        self.resize = next((s for s in steps if isinstance(s, Resize)), None)
        self.center = next((s for s in steps if isinstance(s, CenterCrop)), None)
        if self.random_crop is None and (self.resize is None or self.center is None):
            raise ValueError(f"no crop to reproduce on the device in {steps}")

    def __call__(self, image: torch.Tensor, seed: int) -> torch.Tensor:
        if self.random_crop is not None:
            rrc = self.random_crop
            # The PIL path runs the transform under this seed and get_params is its first draw.
            with seeded_cpu_generator(seed):
                top, left, height, width = RandomResizedCrop.get_params(image, rrc.scale, rrc.ratio)
            return F.resized_crop(image, top, left, height, width, list(rrc.size),
                                  interpolation=InterpolationMode.BICUBIC, antialias=True)
        image = F.resize(image, self.resize.size, interpolation=InterpolationMode.BICUBIC, antialias=True)
        return F.center_crop(image, list(self.center.size))


def decode_jpegs(blobs: List[bytes], device) -> List[Optional[torch.Tensor]]:
    """uint8 [3, h, w] per blob on `device` (None: undecodable): JPEGs in one batched call of
    the device's decoder, the rest (and any JPEG it refuses) by PIL on the host."""
    from torchvision.io import ImageReadMode, decode_jpeg
    out: List[Optional[torch.Tensor]] = [None] * len(blobs)
    jpegs = [i for i, b in enumerate(blobs) if b[:2] == JPEG_MAGIC]
    if jpegs:
        data = [torch.frombuffer(bytearray(blobs[i]), dtype=torch.uint8) for i in jpegs]
        try:
            decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize(device)  # the batched decode's own streams have written
        except RuntimeError:  # one bad JPEG fails the batch: decode them one by one
            decoded = []
            for d in data:
                try:
                    decoded.append(decode_jpeg(d, mode=ImageReadMode.RGB, device=device))
                except RuntimeError:
                    decoded.append(None)
        for i, image in zip(jpegs, decoded):
            out[i] = image
    for i, blob in enumerate(blobs):
        if out[i] is None:
            try:
                out[i] = F.pil_to_tensor(decode_image(blob)).to(device)
            except SkipSample:
                pass
    return out


class DevicePieces(DecodePieces):
    """DecodePieces decoding with torchvision on `device`."""

    def __init__(self, transform, seed: int, device):
        super().__init__(transform, seed)
        self.crops, self.device = DeviceCrops(transform), torch.device(device)

    def images(self, blobs, epoch: int, indices) -> List[Optional[torch.Tensor]]:
        return [None if image is None else self.crops(image, sample_seed(self.seed, epoch, index))
                for image, index in zip(decode_jpegs(blobs, self.device), indices)]


class DeviceDecoder(ChunkDecoder):
    """ChunkDecoder decoding with torchvision in the calling process (no pool), on `device`."""

    def __init__(self, transform, seed: int, device):
        super().__init__(transform, seed, 0, "torchvision", device)
