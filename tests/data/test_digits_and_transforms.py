"""The digits dataset (infcl_ds/data/digits.py) and the image transforms (data/transforms.py) on
CPU: the dataset's layout, command and eval split; the uint8 path against open_clip's own val
transform, chunk slices, the model's normalisation, and per-sample deterministic augmentation."""
import io
import json
from collections import Counter

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from id_samples import build, read_tar

from infcl_ds.data import HostBatch, build_eval_data
from infcl_ds.data.commands.digits import NUMBER_WORDS, main as digits_main
from infcl_ds.data.decoding.transforms import uint8_image_transform


# ---------------------------------------------------------------------------- digits

def test_digits_layout(digits_dir):
    splits = {}
    for split in ("train", "test"):
        splits[split] = {}
        for shard in sorted((digits_dir / split).glob("shard-*.tar")):
            splits[split].update(read_tar(shard))
    train, test = splits["train"], splits["test"]
    assert len(train) + len(test) == 1797 and len(test) == 360
    assert not set(train) & set(test)
    assert all(len(k) == 9 and k.isdigit() for k in (*train, *test))

    labels = {}
    for key, members in (*train.items(), *test.items()):
        assert set(members) == {"png", "txt", "json"}
        meta = json.loads(members["json"])
        label, caption = meta["label"], members["txt"].decode()
        assert meta["classname"] == NUMBER_WORDS[label]
        assert caption.strip() and (NUMBER_WORDS[label] in caption or str(label) in caption)
        labels[key] = label
    image = Image.open(io.BytesIO(next(iter(test.values()))["png"]))
    assert image.size == (32, 32) and image.mode == "RGB"

    # Stratified: each class's held-out share is 20% up to rounding.
    per_class = Counter(labels.values())
    held_out = Counter(labels[k] for k in test)
    assert all(abs(held_out[c] - 0.2 * per_class[c]) <= 1 for c in range(10))
    # Several caption templates are in use.
    assert len({m["txt"].decode().replace(str(labels[k]), "#") for k, m in train.items()}) > 10

    prompts = json.loads((digits_dir / "zeroshot.json").read_text())
    assert prompts["classnames"] == list(NUMBER_WORDS)
    assert len(prompts["templates"]) >= 2 and all("{}" in t for t in prompts["templates"])
    assert (digits_dir / "README.txt").read_text().strip()


def test_digits_cli(tmp_path, capsys):
    assert digits_main(["--out", str(tmp_path), "--image-size", "16", "--seed", "1"]) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and "1437 train + 360 test" in line
    first = next(iter(read_tar(tmp_path / "test/shard-000000.tar").values()))
    assert Image.open(io.BytesIO(first["png"])).size == (16, 16)


def test_eval_data_on_digits(digits_dir, tokenizer):
    data = build_eval_data(digits_dir / "test", image_size=24, tokenizer=tokenizer, batch_size=100, workers=0)
    assert data.classnames == list(NUMBER_WORDS) and all("{}" in t for t in data.templates)
    assert data.num_samples == 360
    batches = list(data)
    assert [len(b[1]) for b in batches] == [100, 100, 100, 60]
    images, labels, texts = (torch.cat(parts) for parts in zip(*batches))
    assert images.shape == (360, 3, 24, 24) and images.dtype == torch.float32
    assert texts.shape == (360, 16) and texts.dtype == labels.dtype == torch.int64
    shard = read_tar(digits_dir / "test/shard-000000.tar")
    assert labels.tolist() == [json.loads(m["json"])["label"] for m in shard.values()]
    # Fixed order, whatever the workers.
    again = build_eval_data({"path": str(digits_dir / "test"), "workers": 2}, image_size=24,
                            tokenizer=tokenizer, batch_size=100)
    for (a, b) in zip(batches, again):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------------------- transforms

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
