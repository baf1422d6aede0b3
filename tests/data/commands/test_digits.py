"""The digits dataset (infcl_ds/data/commands/digits.py) on CPU: the dataset's layout, its
command, and its evaluation split."""
import io
import json
from collections import Counter

import torch
from PIL import Image

from id_samples import read_tar

from infcl_ds.data import build_eval_data
from infcl_ds.data.commands.digits import NUMBER_WORDS, main as digits_main


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
