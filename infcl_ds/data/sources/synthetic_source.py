"""Synthetic samples: noise images and random captions, no files (`data.source: synthetic`)."""
import io

import numpy as np
from PIL import Image

from ...shown import shown
from ..errors import DataError
from .samples import EncodedSample, Sample


class SyntheticSource:
    """`size` samples (no files), for throughput runs and tests: uniform-noise RGB images
    (`image_size` square) with captions of random lowercase "words", which the tokenizer turns
    into random token ids of random length. Sample `index` is a pure function of the index, so
    any order or resume sees the same data."""

    def __init__(self, size: int, image_size: int):
        if not isinstance(size, int) or size <= 0:
            raise DataError(f"synthetic_size must be a positive int, got {shown(size)}")
        self.size, self.image_size = size, image_size

    def __len__(self) -> int:
        return self.size

    def load(self, index: int) -> Sample:
        rng = np.random.default_rng(index)
        pixels = rng.integers(0, 256, (self.image_size, self.image_size, 3), dtype=np.uint8)
        words = ("".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(2, 9)))
                 for _ in range(rng.integers(3, 12)))
        return Sample(Image.fromarray(pixels), " ".join(words))

    def load_encoded(self, index: int) -> EncodedSample:
        """The same sample as PNG bytes: lossless, so it decodes to `load`'s pixels."""
        sample = self.load(index)
        buf = io.BytesIO()
        sample.image.save(buf, format="PNG", compress_level=1)
        return EncodedSample(buf.getvalue(), sample.caption)
