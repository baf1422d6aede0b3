"""A WebDataset shard of small JPEG photographs and the encoded local batches built from it, as
the trainer builds them (test_encoded.py, test_decode_queue.py). `both_passes` asks for the
chunks as the engine does, after announcing them as it does."""
import io
import time

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from data_section import data_section
from infcl_ds.data import build_train_data
from infcl_ds.data.decoding.decode_pool import DECODE_PIECE_ROWS

IMAGE_SIZE, SAMPLES = 24, 40


def photo_jpeg(i: int, rng) -> bytes:
    """A JPEG of a random crop of one of scikit-learn's two photographs (natural statistics)."""
    from sklearn.datasets import load_sample_images
    photos = load_sample_images().images
    photo = photos[i % len(photos)]
    h, w = rng.integers(30, 60, 2)
    y, x = rng.integers(0, photo.shape[0] - h), rng.integers(0, photo.shape[1] - w)
    buf = io.BytesIO()
    Image.fromarray(photo[y:y + h, x:x + w]).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_shard(path, corrupt=()):
    rng = np.random.default_rng(0)
    with wds.TarWriter(str(path)) as sink:
        for i in range(SAMPLES):
            image = photo_jpeg(i, rng)
            if i in corrupt:
                image = image[:len(image) // 3] if i % 2 else b"\xff\xd8 not a jpeg"
            sink.write({"__key__": f"{i:09d}", "jpg": image, "txt": f"photo number {i}"})
    return path


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    return write_shard(tmp_path_factory.mktemp("photos") / "shard-000000.tar")


@pytest.fixture(scope="module")
def tokenizer():
    from open_clip import get_tokenizer
    return get_tokenizer("ViT-B-32")


def first_batch(shard, tokenizer, host_batch, *, decode_workers=0, local_batch=SAMPLES, rank=0, world_size=1,
                augment=True, decoder="pil", **spec):
    spec = {"source": "webdataset", "train": str(shard), "augment": augment, "workers": 0,
            "host_batch": host_batch, "decode_workers": decode_workers, "decoder": decoder, **spec}
    data = build_train_data(data_section(spec), rank=rank, world_size=world_size, local_batch=local_batch, seed=7,
                            image_size=IMAGE_SIZE, tokenizer=tokenizer)
    return next(iter(data))


def pool_data(shard, tokenizer, local_batch=SAMPLES // 2, workers=2, **spec):
    spec = {"source": "webdataset", "train": str(shard), "workers": 0, "host_batch": "encoded",
            "decode_workers": workers, **spec}
    return build_train_data(data_section(spec), rank=0, world_size=1, local_batch=local_batch, seed=7,
                            image_size=IMAGE_SIZE, tokenizer=tokenizer)


def chunks_of(batch, chunk):
    return [(lo, min(lo + chunk, len(batch))) for lo in range(0, len(batch), chunk)]


def announce_both_passes(batch, chunk):
    """The engine's order for chunks of `chunk` rows: every chunk without grad, then with grad."""
    if hasattr(batch, "announce_passes"):
        batch.announce_passes([chunks_of(batch, chunk)] * 2)


def both_passes(batch, chunk):
    """Chunks as the engine asks for them, announced first: every chunk, twice over."""
    announce_both_passes(batch, chunk)
    cpu = torch.device("cpu")
    return [[batch.chunk(lo, hi, cpu) for lo, hi in chunks_of(batch, chunk)] for _ in range(2)]


def in_process(batch, lo, hi):
    """Rows [lo, hi) decoded here, piece by piece as the pool cuts them: the reference pixels."""
    return torch.cat([batch.decoder.decode_now(batch.request(a, min(a + DECODE_PIECE_ROWS, hi)))[1]
                      for a in range(lo, hi, DECODE_PIECE_ROWS)])


def wait_until(condition, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.05)
