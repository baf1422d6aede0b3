"""The PIL decoder: a decode request -> a piece's pixels, open_clip's exactly. The decode
processes run it (decode_pool.py), the training process too for a chunk nobody announced
(encoded.py), and the torchvision and GPU decoders build on it (device_decode.py). An image that
does not decode is replaced by the next decodable row of its piece (replacement_sources).
"""
from typing import List, Optional, Sequence

import torch
from torch.utils.data import Dataset
from torchvision.transforms.functional import pil_to_tensor

from ..errors import DataError
from ..sources.samples import SkipSample, decode_image
from .transforms import transform_image

JPEG_MAGIC = b"\xff\xd8"  # how a JPEG file starts: the GPU decoders take these, PIL the rest


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


def by_pil_where_missing(blobs: Sequence[bytes], out: List[Optional[torch.Tensor]],
                         device) -> List[Optional[torch.Tensor]]:
    """`out` (a GPU decoder's uint8 [3, h, w] images, before any crop) with each None it left
    (not a JPEG, or one it refused) decoded by PIL on the host and moved to `device`; None where
    PIL cannot decode it either."""
    for i, blob in enumerate(blobs):
        if out[i] is None:
            try:
                out[i] = pil_to_tensor(decode_image(blob)).to(device)
            except SkipSample:
                pass
    return out
