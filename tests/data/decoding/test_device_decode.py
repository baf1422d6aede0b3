"""data/decoding/device_decode.py: the batched crop-and-resize the GPU decoder uses, against
torchvision's own resize one image at a time (float path: equal; uint8 path: within one level), for
crops that shrink, that grow, of one pixel, and for the evaluation geometry (Resize + CenterCrop)."""
import pytest
import torch
from torchvision.transforms import CenterCrop, Compose, InterpolationMode, Resize
from torchvision.transforms import functional as F

from infcl_ds.data.decoding.device_decode import Box, CropGeometry, resized_crops
from infcl_ds.data.decoding.transforms import uint8_image_transform
from crops import random_crops


def test_batched_crops_equal_torchvisions_resize_image_by_image():
    images, boxes = random_crops(50, seed=0)
    images.append(torch.randint(0, 256, (3, 1, 1), dtype=torch.uint8))  # one pixel, grown to 24 x 24
    boxes.append(Box(0, 0, 1, 1, 24, 24, 0, 0))
    got = resized_crops(images, boxes, 24)
    assert got.shape == (51, 3, 24, 24) and got.dtype == torch.uint8
    unequal = 0
    for image, b, out in zip(images, boxes, got):
        args = (b.top, b.left, b.height, b.width, [24, 24])
        # The same weights summed in another order: a value within float32 rounding of a half
        # may round the other way, nothing more.
        as_float = F.resized_crop(image.float(), *args, interpolation=InterpolationMode.BICUBIC, antialias=True)
        diff = (out.float() - as_float.round().clamp(0, 255)).abs()
        assert diff.max() <= 1, b
        unequal += int((diff > 0).sum())
        as_uint8 = F.resized_crop(image, *args, interpolation=InterpolationMode.BICUBIC, antialias=True)
        assert (out.float() - as_uint8.float()).abs().max() <= 1, b
    assert unequal <= got.numel() // 10_000, unequal


def test_an_images_pixels_do_not_depend_on_the_images_beside_it():
    """A row decoded in a hybrid chunk's GPU share equals the same row in an nvjpeg chunk."""
    images, boxes = random_crops(30, seed=1)
    whole = resized_crops(images, boxes, 24)
    for lo, hi in ((0, 7), (7, 8), (8, 30)):
        assert torch.equal(resized_crops(images[lo:hi], boxes[lo:hi], 24), whole[lo:hi])


@pytest.mark.parametrize("shape", [(40, 61), (61, 40), (24, 24), (17, 90)])
def test_the_evaluation_geometry_is_resize_then_center_crop(shape):
    transform = uint8_image_transform(24, augment=False)
    geometry = CropGeometry(transform)
    image = torch.randint(0, 256, (3, *shape), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    box = geometry.box(image, seed=0)
    got = resized_crops([image], [box], 24)[0]
    resize = next(s for s in transform.transforms if isinstance(s, Resize))
    want = Compose([Resize(resize.size, interpolation=InterpolationMode.BICUBIC, antialias=True),
                    CenterCrop(24)])(image.float()).round().clamp(0, 255)
    diff = (got.float() - want).abs()
    assert diff.max() <= 1 and (diff > 0).sum() <= 2, diff.sum()  # the geometry is exact: rounding only


def test_crop_draws_equal_torchvisions_under_the_global_seed_without_touching_it():
    """The GPU decoder's thread draws each crop from a generator of its own, with the draws
    the PIL path makes from torch's global generator under the same seed."""
    from torchvision.transforms import RandomResizedCrop
    from infcl_ds.data.decoding.crop_draws import random_resized_crop_params
    from infcl_ds.data.decoding.transforms import seeded_cpu_generator
    before = torch.get_rng_state()
    for seed, (height, width) in enumerate([(40, 61), (300, 20), (1, 1), (224, 224), (17, 900)] * 20):
        got = random_resized_crop_params(height, width, (0.9, 1.0), (3 / 4, 4 / 3), seed)
        with seeded_cpu_generator(seed):
            want = RandomResizedCrop.get_params(torch.empty(3, height, width), (0.9, 1.0), (3 / 4, 4 / 3))
        assert got == tuple(want), (seed, height, width)
    assert torch.equal(torch.get_rng_state(), before)
