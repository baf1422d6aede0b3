"""data/decoding/crop_draws.py: RandomResizedCrop's draws for many rows at once, against torch's own
generator drawn row by row (crop_draws.random_resized_crop_params, itself checked against
torchvision's get_params under the global seed in test_device_decode.py). Exact equality: a crop
off by one pixel would give the GPU decoder other pixels than the PIL path's."""
import numpy as np
import pytest
import torch

from infcl_ds.data.decoding import crop_draws
from infcl_ds.data.decoding.crop_draws import mt19937_first_outputs, random_resized_crop_params, random_resized_crops
from infcl_ds.data.decoding.device_decode import Box, CropGeometry
from infcl_ds.data.decoding.transforms import uint8_image_transform


def seeds_of(n: int, entropy: int):
    return [int(s) for s in np.random.SeedSequence(entropy).generate_state(n, np.uint64)]  # 64-bit, as sample_seed


def test_the_generator_replica_gives_torchs_outputs_for_64_bit_seeds():
    seeds = seeds_of(300, 1) + [0, 1, 2 ** 32 - 1, 2 ** 32, 2 ** 64 - 1]
    raw = mt19937_first_outputs(seeds, 3)
    for r, seed in enumerate(seeds):
        g = torch.Generator().manual_seed(seed)
        assert torch.empty(1).uniform_(0, 1, generator=g).item() == int(raw[0, r] & 0xFFFFFF) / 2 ** 24
        assert torch.randint(0, 1_000_003, (1,), generator=g).item() == int(raw[1, r]) % 1_000_003
        assert torch.randint(0, 7, (1,), generator=g).item() == int(raw[2, r]) % 7


@pytest.mark.parametrize("scale,ratio", [((0.9, 1.0), (3 / 4, 4 / 3)),   # open_clip's train transform
                                         ((0.08, 1.0), (3 / 4, 4 / 3)),  # torchvision's default
                                         ((0.5, 0.5), (0.2, 5.0))])
def test_crops_equal_torchs_row_by_row_draws(scale, ratio):
    rng = np.random.default_rng(3)
    n = 3000
    heights, widths = rng.integers(1, 900, n), rng.integers(1, 900, n)
    heights[:300], widths[300:600] = rng.integers(1, 5, 300), rng.integers(1, 5, 300)  # rejections, central crops
    heights[600:900] = widths[600:900]                                                    # squares: first draws fit
    heights, widths = [int(v) for v in heights], [int(v) for v in widths]
    seeds = seeds_of(n, 4)
    got = random_resized_crops(heights, widths, seeds, scale, ratio)
    want = [tuple(random_resized_crop_params(h, w, scale, ratio, s)) for h, w, s in zip(heights, widths, seeds)]
    assert got == want
    assert random_resized_crops([], [], [], scale, ratio) == []


def test_geometry_boxes_equal_box_by_box_for_both_transforms():
    images = [torch.zeros(3, h, w, dtype=torch.uint8) for h, w in [(300, 400), (224, 224), (1, 1), (17, 900), (900, 3)]]
    seeds = seeds_of(len(images), 5)
    for augment in (True, False):
        geometry = CropGeometry(uint8_image_transform(224, augment=augment))
        assert geometry.boxes(images, seeds) == [geometry.box(im, s) for im, s in zip(images, seeds)]


def test_a_torch_that_draws_otherwise_gets_the_row_by_row_draws(monkeypatch):
    assert crop_draws.verified((0.9, 1.0), (3 / 4, 4 / 3))  # this torch: the vectorised draws are used
    calls = []
    monkeypatch.setattr(crop_draws, "verified", lambda scale, ratio: calls.append(scale) or False)
    monkeypatch.setattr(crop_draws, "random_resized_crops",
                        lambda *a: pytest.fail("unverified draws must not be used"))
    geometry = CropGeometry(uint8_image_transform(32, augment=True))
    images, seeds = [torch.zeros(3, 40, 50, dtype=torch.uint8)] * 3, seeds_of(3, 6)
    boxes = geometry.boxes(images, seeds)
    assert calls and all(isinstance(b, Box) for b in boxes)
    assert boxes == [geometry.box(im, s) for im, s in zip(images, seeds)]
