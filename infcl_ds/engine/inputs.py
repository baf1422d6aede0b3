"""Local batches the engine reads one chunk at a time.

The engine never holds a local batch on the GPU whole (375k images are ~56 GB as uint8): it
asks its batch for ``chunk(lo, hi, device, dtype)`` twice per chunk, once per pass, and gets
the same inputs both times. ``infcl_ds.data.HostBatch`` (pinned uint8 images, normalised per
chunk on the device) has this interface; ``TensorBatch`` gives it to plain tensors. A batch
that prepares its chunks ahead (``infcl_ds.data.EncodedBatch`` decodes them) may also have
``announce_passes(passes)``: the engine calls it first with the chunks it will ask for, pass by pass.
"""
from typing import Protocol, Tuple

import torch


class ChunkedBatch(Protocol):
    def __len__(self) -> int: ...

    def chunk(self, lo: int, hi: int, device: torch.device, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]: ...


class TensorBatch:
    """Image (or any floating) inputs and token ids already in tensors, on any device."""

    def __init__(self, images: torch.Tensor, texts: torch.Tensor):
        if images.shape[0] != texts.shape[0]:
            raise ValueError(f"images and texts differ in batch size: {images.shape[0]} vs {texts.shape[0]}")
        self.images, self.texts = images, texts

    def __len__(self) -> int:
        return self.images.shape[0]

    def chunk(self, lo, hi, device, dtype):
        images = self.images[lo:hi].to(device, non_blocking=True)
        if images.is_floating_point():
            images = images.to(dtype)
        texts = self.texts[lo:hi].to(device, non_blocking=True)
        if texts.is_floating_point():
            texts = texts.to(dtype)
        return images, texts
