"""open_clip's image transforms, stopped before the float conversion, and their per-slot seeding.

The PIL steps (resize, crop, RandomResizedCrop, RGB conversion) are taken from open_clip's own
`image_transform`, so the pixels are exactly OpenCLIP's; only its last two steps (ToTensor,
Normalize) are replaced by a uint8 tensor conversion, and `batch.normalize` redoes them later on
the device.
"""
from contextlib import contextmanager

import numpy as np
import torch
from open_clip.transform import image_transform
from torchvision.transforms import Compose, Normalize, PILToTensor, ToTensor


def uint8_image_transform(image_size: int, augment: bool) -> Compose:
    """PIL image -> uint8 [3, H, W]: open_clip's train transform (RandomResizedCrop with
    scale (0.9, 1.0), bicubic) when `augment`, else its val transform (bicubic resize of the
    shortest side, center crop)."""
    steps = image_transform(image_size, is_train=augment).transforms
    # open_clip ends every (non-timm) pipeline with ToTensor then Normalize; fail loudly if a
    # future version adds float-domain steps that this split would silently drop.
    if not (isinstance(steps[-2], ToTensor) and isinstance(steps[-1], Normalize)):
        raise RuntimeError(f"unexpected open_clip transform tail: {steps[-2:]}")
    return Compose([*steps[:-2], PILToTensor()])


def transform_image(transform, image, seed: int, epoch: int, index: int) -> torch.Tensor:
    """The slot's augmented uint8 image. Seeded by the slot (epoch, index): the crop depends on
    nothing a resume, a worker count or a second decode of the same bytes could change."""
    with seeded_cpu_generator(sample_seed(seed, epoch, index)):  # torchvision draws from it
        return transform(image)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 64-bit seed for one sample's augmentation, a pure function of (seed, epoch, index):
    the crop of a sample does not depend on which worker decodes it or on a resume."""
    return int(np.random.SeedSequence((seed, epoch, index)).generate_state(1, np.uint64)[0])


@contextmanager
def seeded_cpu_generator(seed: int):
    """torch's global CPU generator seeded with `seed` inside the block, its state restored after.
    The same draws as `torch.random.fork_rng(devices=[])` + `torch.manual_seed(seed)`, at a
    fiftieth of their cost (0.002 ms, not 0.19): it runs once per sample per pass, and the
    decoding of a 224 px sample takes ~2 ms in all."""
    generator = torch.default_generator
    state = generator.get_state()
    generator.manual_seed(seed)
    try:
        yield
    finally:
        generator.set_state(state)
