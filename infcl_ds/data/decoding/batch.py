"""Host-side batches: uint8 images stay on the host until the engine moves one chunk at a time.

Keeping images as uint8 until the chunk reaches its device costs a quarter of the host memory
and of the host-to-device traffic of float32, which matters when a local batch holds tens of
thousands of images. The float conversion then happens on the device.
"""
from dataclasses import dataclass
from typing import Tuple

import torch
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD


def normalize(images: torch.Tensor, mean=OPENAI_DATASET_MEAN, std=OPENAI_DATASET_STD,
              dtype=torch.float32) -> torch.Tensor:
    """uint8 [n, 3, H, W] -> (x / 255 - mean) / std, in `dtype`, on the images' device.

    The arithmetic is that of torchvision's ToTensor and Normalize (float32 divide by 255,
    subtract, divide), so the result equals open_clip's own transform; the cast to `dtype`
    comes last so that bf16/fp16 round only once.
    """
    mean = torch.as_tensor(mean, dtype=torch.float32, device=images.device).view(-1, 1, 1)
    std = torch.as_tensor(std, dtype=torch.float32, device=images.device).view(-1, 1, 1)
    return images.to(torch.float32).div(255).sub(mean).div(std).to(dtype)


@dataclass
class HostBatch:
    """One rank's local batch, on the host (page-locked when CUDA is available).

    images: uint8 [n, 3, H, W], after resize/crop/augmentation, before /255 and normalisation.
    texts: int64 [n, context_length] token ids.
    mean, std: the model's normalisation (its preprocess_cfg: OpenAI's for most open_clip
    models, 0.5 for SigLIP's), applied per chunk on the device.
    """
    images: torch.Tensor
    texts: torch.Tensor
    mean: Tuple[float, ...] = OPENAI_DATASET_MEAN
    std: Tuple[float, ...] = OPENAI_DATASET_STD

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def nbytes(self) -> int:
        return self.images.numel() + self.texts.numel() * self.texts.element_size()

    def decoded(self, lo: int, hi: int, device=None):
        """Rows [lo, hi): (uint8 images, int64 texts), as EncodedBatch.decoded."""
        return self.images[lo:hi], self.texts[lo:hi]

    def chunk(self, lo: int, hi: int, device, dtype=torch.float32):
        """Rows [lo, hi) on `device`: (normalised images in `dtype`, int64 texts). The uint8
        slice is copied (overlapping compute when pinned), then normalised on the device."""
        images = self.images[lo:hi].to(device, non_blocking=True)
        texts = self.texts[lo:hi].to(device, non_blocking=True)
        return normalize(images, self.mean, self.std, dtype), texts
