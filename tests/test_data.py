"""The data layer on CPU: the digits dataset, rank coverage and determinism, exact resume (also
with worker processes), skipped samples, build-time errors, CSV and synthetic sources, and the
uint8 path against open_clip's own val transform.

Sample identity: `id_shards` writes images of one flat colour encoding the sample id
(R + 256 G), which the val transform (resize to the same size, center crop) keeps exactly."""
import io
import json
import tarfile
from collections import Counter

import numpy as np
import open_clip
import pytest
import torch
import webdataset as wds
from PIL import Image

from data_section import data_section
from launch_utils import data_check

from infcl_ds.config import RecipeError, load_recipe
from infcl_ds.data import DataError, HostBatch, build_eval_data, build_train_data
from infcl_ds.data.digits import NUMBER_WORDS, build_digits, main as digits_main
from infcl_ds.data.sampler import epoch_order
from infcl_ds.data.transforms import uint8_image_transform

ID_SHARD_SIZES = (7, 13, 3)  # uneven on purpose
NUM_IDS = sum(ID_SHARD_SIZES)


@pytest.fixture(scope="module", autouse=True)
def index_cache(tmp_path_factory):
    """Tar indexes go to a temporary cache, not ~/.cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFCL_DS_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def tokenizer():
    return open_clip.tokenizer.SimpleTokenizer(context_length=16)


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    build_digits(out, image_size=32, seed=0)
    return out


def id_image(i: int) -> Image.Image:
    return Image.new("RGB", (8, 8), (i % 256, i // 256, 0))


def write_shard(path, samples):
    """samples: dicts of member ext -> content (PIL image, bytes or str), "__key__" included."""
    with wds.TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)


@pytest.fixture(scope="module")
def id_shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ids")
    first = 0
    for s, size in enumerate(ID_SHARD_SIZES):
        write_shard(folder / f"shard-{s:06d}.tar",
                    [{"__key__": f"{i:09d}", "png": id_image(i), "txt": f"sample {i}"}
                     for i in range(first, first + size)])
        first += size
    return folder


def ids_of(batch):
    images, _ = batch.decoded(0, len(batch))
    return (images[:, 0, 0, 0].long() + 256 * images[:, 1, 0, 0].long()).tolist()


def build(spec, tokenizer, *, rank=0, world_size=1, local_batch=4, seed=0, image_size=8, **kw):
    return build_train_data(data_section(spec), rank=rank, world_size=world_size, local_batch=local_batch, seed=seed,
                            image_size=image_size, tokenizer=tokenizer, **kw)


def id_spec(folder, **kw):
    return {"source": "webdataset", "train": str(folder), "augment": False, "workers": 0, **kw}


def epoch_ids(data, epoch):
    data.set_epoch(epoch)
    return [ids_of(b) for b in data]


def read_tar(path):
    """{key: {ext: bytes}} of one shard."""
    samples = {}
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            key, ext = m.name.split(".", 1)
            samples.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return samples


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


# ---------------------------------------------------------------------------- distribution

@pytest.mark.parametrize("world_size, local_batch", [(1, 4), (2, 3), (3, 2), (3, 5)])
def test_ranks_cover_the_epoch_once(id_shards, tokenizer, world_size, local_batch):
    per_rank = [build(id_spec(id_shards, worker_batch=2), tokenizer, rank=r, world_size=world_size,
                      local_batch=local_batch, seed=3) for r in range(world_size)]
    steps = NUM_IDS // (world_size * local_batch)
    assert all(d.steps_per_epoch == steps and d.num_samples == NUM_IDS for d in per_rank)
    seen = [epoch_ids(d, 0) for d in per_rank]
    assert all(len(batches) == steps and all(len(b) == local_batch for b in batches) for batches in seen)
    union = [i for batches in seen for b in batches for i in b]
    assert len(union) == len(set(union)) == steps * world_size * local_batch
    # What is left out is the tail of the epoch's permutation: the global remainder.
    assert set(union) == set(epoch_order(NUM_IDS, 3, 0)[:len(union)].tolist())
    # Deterministic for (seed, epoch); another epoch is another order.
    fresh = build(id_spec(id_shards), tokenizer, world_size=world_size, local_batch=local_batch, seed=3)
    assert epoch_ids(fresh, 0) == seen[0]
    assert epoch_ids(fresh, 1) != seen[0]


def test_without_drop_last_the_last_batch_wraps_around(id_shards, tokenizer):
    per_rank = [build(id_spec(id_shards), tokenizer, rank=r, world_size=2, local_batch=5, drop_last=False)
                for r in range(2)]
    assert per_rank[0].steps_per_epoch == 3  # ceil(23 / 10)
    union = [i for d in per_rank for b in epoch_ids(d, 0) for i in b]
    assert len(union) == 30 and set(union) == set(range(NUM_IDS))


# ---------------------------------------------------------------------------- resume

@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_exact(digits_dir, tokenizer, workers):
    spec = {"source": "webdataset", "train": str(digits_dir / "train/shard-000000.tar"), "augment": True}
    layout = dict(rank=1, world_size=2, local_batch=16, seed=7, image_size=32)
    reference = build({**spec, "workers": 0}, tokenizer, **layout)
    reference.set_epoch(2)
    expected = list(reference)
    assert len(expected) == reference.steps_per_epoch == 500 // 32

    # Interrupted runs decode in pieces of 5 (16 = 5 + 5 + 5 + 1), with `workers` processes.
    pieces = {**spec, "workers": workers, "worker_batch": 5}
    first = build(pieces, tokenizer, **layout)
    first.set_epoch(2)
    stream = iter(first)
    head = [next(stream) for _ in range(4)]
    state = first.state_dict()
    stream.close()
    assert state == {"epoch": 2, "step": 4, "skipped": 0}
    # Closing the stream ends its batch-ahead thread there (not at interpreter exit, where a
    # thread inside the DataLoader can abort the process).
    import threading
    assert not [t for t in threading.enumerate() if t.name == "infcl-ds-next-batch"]

    resumed = build(pieces, tokenizer, **layout)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # the trainer's usual call after a resume: keeps the position
    rest = list(resumed)
    assert len(head) + len(rest) == len(expected)
    for got, want in zip(head + rest, expected):
        assert torch.equal(got.decoded(0, len(got))[0], want.decoded(0, len(want))[0]) and torch.equal(got.decoded(0, len(got))[1], want.decoded(0, len(want))[1])
    assert resumed.state_dict()["step"] == resumed.steps_per_epoch and list(resumed) == []
    # The interrupted object itself continues too: its workers (forked once, shared by every
    # iteration) drop the pieces they had prefetched for the stream that was closed.
    again = list(first)
    assert len(again) == len(rest)
    for got, want in zip(again, rest):
        assert torch.equal(got.decoded(0, len(got))[0], want.decoded(0, len(want))[0])


def test_a_stream_stuck_in_its_loader_is_not_restarted_under_it(id_shards, tokenizer, monkeypatch):
    import threading

    from infcl_ds.data import train_stream
    data = build(id_spec(id_shards, worker_batch=4), tokenizer, local_batch=8)
    release, stalled, calls = threading.Event(), threading.Event(), [0]
    load = type(data.dataset).__getitem__

    def slow(self, item):  # the batch-ahead thread stalls inside the loader after the first batch
        calls[0] += 1
        if calls[0] > 8:
            stalled.set()
            release.wait(30)
        return load(self, item)
    monkeypatch.setattr(type(data.dataset), "__getitem__", slow)
    monkeypatch.setattr(train_stream._AssembledAhead, "STOP_TIMEOUT_S", 0.2)
    stream = iter(data)
    next(stream)
    assert stalled.wait(30)
    stream.close()  # stop() gives up after 0.2 s: the thread is still inside the loader
    with pytest.raises(DataError, match="still inside its data loader"):
        next(iter(data))
    release.set()
    # Let the thread leave the loader before the loader is dropped: a loader collected while a
    # thread is still inside it shuts its workers down under that thread.
    data._ahead._thread.join(30)
    assert not data._ahead.running()


def test_close_ends_both_worker_pools(id_shards, tokenizer):
    data = build(id_spec(id_shards, workers=2, decode_workers=2), tokenizer, local_batch=8)
    next(iter(data))
    workers = data._loader._iterator._workers + data.decoder.pool._procs
    assert len(workers) == 4 and all(w.is_alive() for w in workers)
    data.close()
    assert not any(w.is_alive() for w in workers)
    with pytest.raises(DataError, match="closed"):
        next(iter(data))


def test_an_iterator_closed_under_its_consumer_yields_no_partial_batch(id_shards, tokenizer):
    data = build(id_spec(id_shards, workers=2, worker_batch=2), tokenizer, local_batch=8)
    stream = iter(data)
    next(stream)
    data.close()  # from outside the iteration: the batch being read ahead is cut short
    assert data._ahead._results.qsize() == 1  # something waits for the consumer: no wait forever
    with pytest.raises(DataError, match="closed"):
        next(stream)
    assert data.state_dict()["step"] == 1


def test_state_checks(id_shards, tokenizer):
    data = build(id_spec(id_shards), tokenizer)
    data.load_state_dict({"epoch": 1, "step": 2, "skipped": 5})
    data.set_epoch(2)
    assert data.state_dict() == {"epoch": 2, "step": 0, "skipped": 5}
    with pytest.raises(DataError, match="step 99"):
        data.load_state_dict({"epoch": 0, "step": 99, "skipped": 0})


# ---------------------------------------------------------------------------- skipped samples

@pytest.fixture
def damaged_shard(tmp_path):
    """10 samples: #3 has a corrupt image, #6 an empty caption, #8 no caption member."""
    samples = [{"__key__": f"{i:09d}", "png": id_image(i), "txt": f"sample {i}"} for i in range(10)]
    samples[3]["png"] = b"\x89PNG\r\n\x1a\n not really"
    samples[6]["txt"] = "   "
    del samples[8]["txt"]
    write_shard(tmp_path / "damaged.tar", samples)
    return tmp_path / "damaged.tar"


def test_skipped_samples_are_replaced_and_counted(damaged_shard, tokenizer):
    # Decoded host batches find an undecodable image in the worker (encoded ones while the
    # step decodes it: test_encoded.py).
    data = build(id_spec(damaged_shard, workers=2, worker_batch=2, host_batch="decoded"), tokenizer, local_batch=5)
    batches = list(data)
    assert [len(b) for b in batches] == [5, 5] and data.skipped == 3
    # Each unusable sample is replaced by its next neighbour in storage order.
    assert sorted(i for b in batches for i in ids_of(b)) == [0, 1, 2, 4, 4, 5, 7, 7, 9, 9]
    assert data.state_dict()["skipped"] == 3

    per_rank = [build(id_spec(damaged_shard, host_batch="decoded"), tokenizer, rank=r, world_size=2, local_batch=5)
                for r in range(2)]
    for d in per_rank:
        list(d)
    assert sum(d.skipped for d in per_rank) == 3


def test_all_unusable_is_an_error(tmp_path, tokenizer):
    write_shard(tmp_path / "bad.tar", [{"__key__": f"{i:09d}", "png": id_image(i), "txt": ""} for i in range(4)])
    with pytest.raises(DataError, match="all unusable"):
        list(build(id_spec(tmp_path), tokenizer, local_batch=2))


def test_eval_drops_unusable_samples(tmp_path, tokenizer):
    samples = [{"__key__": f"{i:09d}", "png": id_image(i), "txt": f"sample {i}", "cls": i % 2} for i in range(5)]
    samples[2]["png"] = b"garbage"
    write_shard(tmp_path / "test.tar", samples)
    (tmp_path / "zeroshot.json").write_text(json.dumps({"classnames": ["even", "odd"], "templates": ["{}"]}))
    data = build_eval_data(tmp_path / "test.tar", image_size=8, tokenizer=tokenizer, batch_size=2, workers=2)
    labels = torch.cat([labels for _, labels, _ in data])
    assert labels.tolist() == [0, 1, 1, 0] and data.skipped == 1 and data.num_samples == 5


# ---------------------------------------------------------------------------- build-time errors

def test_configuration_errors(tmp_path, id_shards, tokenizer):
    (tmp_path / "empty").mkdir()
    (tmp_path / "no_title.csv").write_text("filepath,caption\na.png,hello\n")
    cases = [
        ({"source": "webdataset", "train": str(tmp_path / "missing")}, "missing"),
        ({"source": "webdataset", "train": str(tmp_path / "shard-{000000..000003}.tar")}, "shard-000000.tar"),
        ({"source": "webdataset", "train": str(tmp_path / "empty/*.tar")}, "matches no file"),
        ({"source": "webdataset", "train": str(tmp_path / "empty")}, "no \\*.tar shards in directory"),
        ({"source": "csv", "train": str(tmp_path / "no_title.csv")}, "title"),
        ({"source": "csv", "train": str(tmp_path / "absent.tsv")}, "absent.tsv"),
        ({"source": "synthetic"}, "synthetic_size"),
        ({"source": "webdataset", "train": str(id_shards)}, "do not fill one global batch"),
    ]
    for spec, message in cases:
        with pytest.raises(DataError, match=message):
            build(spec, tokenizer, world_size=4, local_batch=6)
    assert issubclass(DataError, ValueError)
    # Keys and choices are the recipe's to check, at load.
    for sets, message in ((["data.source=webdataset"], "data.train"),
                          (["data.source=webdataset", "data.train=[]"], "data.train"),
                          (["data.source=parquet"], "parquet")):
        with pytest.raises(RecipeError, match=message):
            load_recipe(None, sets)


def test_eval_errors(tmp_path, id_shards, digits_dir, tokenizer):
    with pytest.raises(DataError, match="without a .cls or .json label"):
        build_eval_data(id_shards, image_size=8, tokenizer=tokenizer)
    write_shard(tmp_path / "labelled.tar", [{"__key__": "000000000", "png": id_image(0), "txt": "a", "cls": 3}])
    with pytest.raises(DataError, match="no zeroshot.json"):
        build_eval_data(tmp_path, image_size=8, tokenizer=tokenizer)
    with pytest.raises(DataError, match="'path'"):
        build_eval_data({"workers": 0}, image_size=8, tokenizer=tokenizer)


# ---------------------------------------------------------------------------- csv and synthetic

def test_csv_source(tmp_path, tokenizer):
    (tmp_path / "img").mkdir()
    rows = ["filepath\ttitle"]
    for i in range(5):
        id_image(i).save(tmp_path / "img" / f"{i}.png")
        rows.append(f"img/{i}.png\tsample {i}")
    rows.append("img/absent.png\tan image that is not there")
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n")
    data = build({"source": "csv", "train": str(tmp_path / "pairs.tsv"), "augment": False, "workers": 0},
                 tokenizer, local_batch=3)
    batches = list(data)
    assert data.num_samples == 6 and len(batches) == data.steps_per_epoch == 2
    assert all(b.decoded(0, len(b))[0].shape == (3, 3, 8, 8) and b.decoded(0, len(b))[1].shape == (3, 16) for b in batches)
    # The missing image is replaced by the next row, wrapping around to row 0.
    assert data.skipped == 1 and sorted(i for b in batches for i in ids_of(b)) == [0, 0, 1, 2, 3, 4]

    (tmp_path / "pairs.csv").write_text("image,text\nimg/1.png,one\nimg/2.png,two\n")
    custom = build({"source": "csv", "train": str(tmp_path / "pairs.csv"), "csv_img_key": "image",
                    "csv_caption_key": "text", "augment": False, "workers": 0}, tokenizer, local_batch=2)
    assert sorted(ids_of(next(iter(custom)))) == [1, 2]


def test_synthetic_source(tokenizer):
    spec = {"source": "synthetic", "synthetic_size": 10, "workers": 0}
    data = build(spec, tokenizer, local_batch=3, image_size=24)
    batches = list(data)
    assert data.num_samples == 10 and len(batches) == data.steps_per_epoch == 3
    for b in batches:
        assert b.decoded(0, len(b))[0].shape == (3, 3, 24, 24) and b.decoded(0, len(b))[0].dtype == torch.uint8
        assert b.decoded(0, len(b))[1].shape == (3, 16) and b.decoded(0, len(b))[1].dtype == torch.int64
    again = list(build(spec, tokenizer, local_batch=3, image_size=24))
    assert all(torch.equal(a.decoded(0, len(a))[0], b.decoded(0, len(b))[0]) and torch.equal(a.decoded(0, len(a))[1], b.decoded(0, len(b))[1]) for a, b in zip(batches, again))


def test_data_check_names_what_is_missing(tmp_path, id_shards, digits_dir):
    from infcl_ds.config import load_recipe
    from infcl_ds.data.check import check_paths

    def data(*sets):
        return load_recipe(None, list(sets)).data
    assert check_paths(data("data.source=synthetic")).startswith("synthetic data")
    found = check_paths(data("data.source=webdataset", f"data.train={id_shards}", f"data.eval={digits_dir}/test"))
    assert found.startswith(f"{len(ID_SHARD_SIZES)} shards") and "evaluation split" in found
    with pytest.raises(DataError, match="matches no file"):
        check_paths(data("data.source=webdataset", f"data.train={tmp_path}/*.tar"))
    with pytest.raises(DataError, match="CSV file .* does not exist"):
        check_paths(data("data.source=csv", f"data.train={tmp_path}/x.csv"))
    with pytest.raises(DataError, match="no zeroshot.json"):
        check_paths(data("data.source=synthetic", f"data.eval={id_shards}"))


# ---------------------------------------------------------------------------- files that are not images

def _special_rows_csv(tmp_path):
    """A CSV of 4 rows: two images, /dev/zero (never ends) and a FIFO (blocks its reader)."""
    import os
    (tmp_path / "img").mkdir()
    for i in (0, 3):
        id_image(i).save(tmp_path / "img" / f"{i}.png")
    fifo = tmp_path / "img" / "fifo.png"
    os.mkfifo(fifo)
    (tmp_path / "pairs.csv").write_text("filepath,title\nimg/0.png,zero\n/dev/zero,one\nimg/fifo.png,two\n"
                                        "img/3.png,three\n")
    return tmp_path / "pairs.csv", fifo


def _release(fifo):
    """Lets a reader blocked on the FIFO go (it sees end of file): the test ends either way."""
    import os
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader waiting


@pytest.mark.parametrize("host_batch", ["encoded", "decoded"])
def test_csv_rows_naming_a_device_or_a_fifo_are_replaced_fast(tmp_path, tokenizer, host_batch):
    import threading
    path, fifo = _special_rows_csv(tmp_path)
    data = build({"source": "csv", "train": str(path), "augment": False, "workers": 0, "host_batch": host_batch},
                 tokenizer, local_batch=2)
    out = {}
    reader = threading.Thread(target=lambda: out.update(batches=list(data)), daemon=True)
    reader.start()
    reader.join(timeout=60)
    _release(fifo)
    assert not reader.is_alive(), "reading the epoch blocked"
    batches = out["batches"]
    # Each unusable row is replaced by the next usable one in storage order (img/3.png twice).
    assert data.skipped == 2 and sorted(i for b in batches for i in ids_of(b)) == [0, 3, 3, 3]


def test_reading_an_image_file_is_bounded(tmp_path, monkeypatch):
    from infcl_ds.data import samples
    from infcl_ds.data.samples import SkipSample, read_image_file
    monkeypatch.setattr(samples, "MAX_IMAGE_BYTES", 1000)
    (tmp_path / "big.png").write_bytes(b"x" * 1001)
    (tmp_path / "fits.png").write_bytes(b"x" * 1000)
    with pytest.raises(SkipSample, match=r"big.png is 0.0 MiB, over the 0 MiB limit \(MAX_IMAGE_BYTES\)"):
        read_image_file(tmp_path / "big.png")
    assert read_image_file(tmp_path / "fits.png") == b"x" * 1000
    with pytest.raises(SkipSample, match="/dev/zero is a character device, not a regular file"):
        read_image_file("/dev/zero")
    with pytest.raises(SkipSample, match="cannot read image .*absent.png"):
        read_image_file(tmp_path / "absent.png")


def test_data_check_names_a_csv_row_that_is_a_device_or_a_fifo(tmp_path, capsys):
    path, fifo = _special_rows_csv(tmp_path)
    code, out = data_check(capsys, "data.source=csv", f"data.train={path}")
    assert code == 2
    assert out.err == (f"infcl-ds data check: CSV {path} line 3: image /dev/zero is a character device, not a regular "
                       f"file; only regular files of at most 64 MiB are read as samples\n")
    path.write_text("filepath,title\nimg/0.png,zero\nimg/absent.png,gone\nimg/fifo.png,two\n")
    code, out = data_check(capsys, "data.source=csv", f"data.train={path}")
    assert code == 2 and f"CSV {path} line 4: image img/fifo.png is a FIFO, not a regular file" in out.err
    path.write_text("filepath,title\nimg/0.png,zero\nimg/absent.png,gone\n")  # a missing image: skipped in training
    assert data_check(capsys, "data.source=csv", f"data.train={path}")[0] == 0


def test_a_shard_that_is_a_fifo_or_a_device_is_refused(tmp_path, id_shards, capsys):
    import os
    import shutil
    shards = tmp_path / "shards"
    shutil.copytree(id_shards, shards)
    os.mkfifo(shards / "shard-000009.tar")
    code, out = data_check(capsys, "data.source=webdataset", f"data.train={shards}")
    assert code == 2
    assert out.err == f"infcl-ds data check: shard {shards}/shard-000009.tar is a FIFO, not a regular file: refused\n"
    code, out = data_check(capsys, "data.source=webdataset", "data.train=/dev/zero")
    assert code == 2 and "shard /dev/zero is a character device, not a regular file: refused" in out.err
    with pytest.raises(DataError, match="shard-000009.tar is a FIFO"):
        build(id_spec(shards), tokenizer=None)
