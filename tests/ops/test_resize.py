"""ops/resize.py: the one-launch crop-and-resize of the GPU decoder, against its torch-op
reference (data/device_decode.resized_crops_torch) and torchvision's own resize, image by image.

Tolerance: one uint8 level, and at most one pixel in 10,000 off by it: the kernel and the
references sum the same float32 products in another order, so a value within rounding of a half
may round the other way; nothing else may differ (the taps and the geometry are the same)."""
import pytest
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F

from crops import random_crops
from devices import DEVICE
from infcl_ds.data.decoding.device_decode import Box, CropGeometry, resized_crops_torch
from infcl_ds.data.decoding.transforms import uint8_image_transform
from infcl_ds.ops.resize import max_taps, resized_crops_kernel

pytestmark = pytest.mark.gpu


def assert_within_rounding(got: torch.Tensor, want: torch.Tensor):
    diff = (got.float() - want.float()).abs()
    assert diff.max() <= 1, diff.max()
    assert (diff > 0).sum() <= max(1, want.numel() // 10_000), int((diff > 0).sum())


def on_device(images):
    return [im.to(DEVICE) for im in images]


def test_equals_the_torch_reference_for_crops_that_shrink_grow_and_are_one_pixel():
    images, boxes = random_crops(6, seed=0, largest=70, size=20)
    images.append(torch.randint(0, 256, (3, 1, 1), dtype=torch.uint8))  # one pixel, grown to 20 x 20
    boxes.append(Box(0, 0, 1, 1, 20, 20, 0, 0))
    images.append(torch.randint(0, 256, (3, 5, 300), dtype=torch.uint8))  # 15x narrower: long windows
    boxes.append(Box(1, 2, 3, 297, 20, 20, 0, 0))
    got = resized_crops_kernel(on_device(images), boxes, 20)
    assert got.shape == (8, 3, 20, 20) and got.dtype == torch.uint8 and got.device.type == DEVICE.type
    assert_within_rounding(got.cpu(), resized_crops_torch(images, boxes, 20))


def test_each_image_within_a_level_of_torchvisions_resize():
    images, boxes = random_crops(4, seed=1, largest=60, size=17)  # 17: not a power of two
    got = resized_crops_kernel(on_device(images), boxes, 17).cpu()
    for image, b, out in zip(images, boxes, got):
        want = F.resized_crop(image.float(), b.top, b.left, b.height, b.width, [17, 17],
                              interpolation=InterpolationMode.BICUBIC, antialias=True).round().clamp(0, 255)
        assert_within_rounding(out, want)


@pytest.mark.parametrize("shape", [(40, 61), (61, 40)])
def test_the_evaluation_geometry_resize_then_center_window(shape):
    transform = uint8_image_transform(16, augment=False)
    image = torch.randint(0, 256, (3, *shape), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    box = CropGeometry(transform).box(image, seed=0)
    assert box.off_y + box.off_x > 0  # the window is offset inside the resized image
    got = resized_crops_kernel(on_device([image]), [box], 16).cpu()
    assert_within_rounding(got, resized_crops_torch([image], [box], 16))


def test_an_images_pixels_do_not_depend_on_the_images_beside_it():
    """A row decoded in a hybrid chunk's GPU share equals the same row in an nvjpeg chunk."""
    images, boxes = random_crops(5, seed=3, largest=50, size=12)
    images = on_device(images)
    whole = resized_crops_kernel(images, boxes, 12)
    for lo, hi in ((0, 2), (2, 3), (3, 5)):
        assert torch.equal(resized_crops_kernel(images[lo:hi], boxes[lo:hi], 12), whole[lo:hi])


def test_taps_bound_each_window():
    for in_len in (1, 2, 7, 224, 225, 1000):
        for out_len in (1, 16, 224):
            scale = in_len / out_len
            support = 2 * scale if scale >= 1 else 2.0
            assert max_taps(in_len, out_len) >= 2 * support + 1


def test_a_box_outside_its_image_is_refused_by_name():
    image = torch.zeros(3, 10, 10, dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match="not inside an image of 10 x 10"):
        resized_crops_kernel([image], [Box(5, 0, 6, 10, 8, 8, 0, 0)], 8)
    with pytest.raises(ValueError, match="uint8"):
        resized_crops_kernel([image.float()], [Box(0, 0, 10, 10, 8, 8, 0, 0)], 8)
    assert resized_crops_kernel([], [], 8).shape == (0, 3, 8, 8)
