"""The image transforms (infcl_ds/data/decoding/transforms.py) and host batches (batch.py) on
CPU: the uint8 path against open_clip's own val transform, chunk slices, the model's
normalisation, and per-sample deterministic augmentation."""
import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from id_samples import build

from infcl_ds.data import HostBatch
from infcl_ds.data.decoding.transforms import uint8_image_transform


@pytest.mark.parametrize("size, mode", [((45, 37), "RGB"), ((20, 64), "RGB"), ((30, 30), "RGBA"), ((50, 40), "L")])
def test_val_transform_matches_open_clip(size, mode, tokenizer):
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).convert(mode)
    expected = open_clip.image_transform(24, is_train=False)(image)
    uint8 = uint8_image_transform(24, augment=False)(image)
    assert uint8.dtype == torch.uint8 and uint8.shape == (3, 24, 24)
    batch = HostBatch(uint8[None], torch.zeros(1, 16, dtype=torch.int64))
    images, _ = batch.chunk(0, 1, "cpu")
    assert (images[0] - expected).abs().max() <= 1e-6


def test_chunk_slices_and_casts():
    g = torch.Generator().manual_seed(0)
    batch = HostBatch(torch.randint(0, 256, (6, 3, 4, 4), dtype=torch.uint8, generator=g),
                      torch.arange(12).view(6, 2), mean=(0.5,) * 3, std=(0.5,) * 3)
    images, texts = batch.chunk(2, 5, torch.device("cpu"), dtype=torch.bfloat16)
    assert len(batch) == 6 and images.shape == (3, 3, 4, 4) and images.dtype == torch.bfloat16
    assert torch.equal(texts, batch.texts[2:5])
    assert torch.allclose(images.float(), batch.images[2:5].float() / 127.5 - 1, atol=1e-2)


def test_training_batches_use_the_models_normalisation(tokenizer):
    """A SigLIP-style model (mean = std = 0.5) trains on its own normalisation, not OpenAI's."""
    data = build({"source": "synthetic", "synthetic_size": 8, "workers": 0}, tokenizer, local_batch=4,
                 mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    batch = next(iter(data))
    images, _ = batch.chunk(0, 4, torch.device("cpu"))
    assert torch.allclose(images, batch.decoded(0, 4)[0].float() / 127.5 - 1, atol=1e-6)


def test_train_transform_is_deterministic_per_sample(digits_dir, tokenizer):
    spec = {"source": "webdataset", "train": str(digits_dir / "train/shard-000000.tar"), "workers": 0}
    first, second = (next(iter(build(spec, tokenizer, image_size=32, local_batch=8))) for _ in range(2))
    assert torch.equal(first.decoded(0, len(first))[0], second.decoded(0, len(second))[0])
    plain = next(iter(build({**spec, "augment": False}, tokenizer, image_size=32, local_batch=8)))
    (augmented, texts), (unaugmented, plain_texts) = first.decoded(0, 8), plain.decoded(0, 8)
    assert torch.equal(texts, plain_texts) and not torch.equal(augmented, unaugmented)
