"""The data sources on CPU (infcl_ds/data/sources/: csv_source.py, synthetic_source.py,
samples.py; data/commands/check.py): skipped samples, build-time errors, CSV and synthetic sources,
`infcl-ds data check`, and files that are not images (devices, FIFOs, unbounded reads).

Sample identity: `id_shards` (tests/data/conftest.py) writes images of one flat colour encoding
the sample id (R + 256 G), which the val transform (resize to the same size, center crop) keeps
exactly."""
import json

import pytest
import torch

from launch_utils import data_check
from id_samples import ID_SHARD_SIZES, build, id_image, id_spec, ids_of, write_shard

from infcl_ds.config import RecipeError, load_recipe
from infcl_ds.data import DataError, build_eval_data


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
    from infcl_ds.data.commands.check import check_paths

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
    from infcl_ds.data.sources import samples
    from infcl_ds.data.sources.samples import SkipSample, read_image_file
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
