"""Random uint8 images and crop boxes inside them, for the crop-and-resize tests
(test_device_decode.py: the torch-op version; test_resize.py: the kernel)."""
import torch

from infcl_ds.data.decoding.device_decode import Box


def random_crops(count: int, seed: int, largest: int = 90, size: int = 24):
    """`count` uint8 [3, h, w] images (sides 1..largest) and a Box per image: a random crop of
    it, resized to size x size."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda hi: int(torch.randint(1, hi + 1, (1,), generator=g))  # noqa: E731
    images, boxes = [], []
    for _ in range(count):
        height, width = draw(largest), draw(largest)
        h, w = draw(height), draw(width)
        top, left = draw(height - h + 1) - 1, draw(width - w + 1) - 1
        images.append(torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=g))
        boxes.append(Box(top, left, h, w, size, size, 0, 0))
    return images, boxes
