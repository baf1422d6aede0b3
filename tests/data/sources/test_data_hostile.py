"""Bad data inputs, as a hostile user would bring them: each is one line naming the file, row or
key (exit 2 where a command ends), or, for one bad sample inside a shard or CSV, a skipped and
counted sample. In process, except one end-to-end run of the CLI."""
import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

from launch_utils import ROOT, data_check
from test_first_day_errors import _one_line

from infcl_ds.data import DataError
from infcl_ds.data.eval_split import find_zeroshot
from infcl_ds.data.sources.csv_source import CsvSource
from infcl_ds.data.sources.samples import MAX_TEXT_BYTES, SkipSample, load_or_replace
from infcl_ds.data.sources.tar_index import cache_header, shard_spans
from infcl_ds.data.sources.webdataset_source import TarSource


@pytest.fixture(autouse=True)
def index_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFCL_DS_CACHE", str(tmp_path / "cache"))  # tar indexes not in ~/.cache


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 200, 10)).save(buf, "PNG")
    return buf.getvalue()


def _shard(path, samples):
    """A tar of samples, each a dict extension -> bytes, keyed 000000, 000001, ..."""
    with tarfile.open(path, "w") as tar:
        for i, members in enumerate(samples):
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _csv(tmp_path, body: bytes, name="pairs.csv"):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    path = tmp_path / name
    path.write_bytes(b"filepath,title\n" + body)
    return path


def _cli(*args):
    """`infcl-ds ARGS` in a fresh Python: (exit code, stderr)."""
    done = subprocess.run([sys.executable, "-m", "infcl_ds.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return done.returncode, done.stderr


# -- zeroshot.json ---------------------------------------------------------------------------

@pytest.mark.parametrize("prompts, why", [
    ({"classnames": "zero", "templates": ["{}"]},
     "'classnames' must be a non-empty list of class names, not a string 'zero'"),
    ({"classnames": [], "templates": ["{}"]},
     "'classnames' must be a non-empty list of class names, not an empty list"),
    ({"classnames": [["zero"]], "templates": ["{}"]}, "'classnames' must hold non-empty strings: item 0 is a list"),
    ({"classnames": ["zero", " "], "templates": ["{}"]},
     "'classnames' must hold non-empty strings: item 1 is a string ' '"),
    ({"templates": ["{}"]}, "'classnames' must be a non-empty list of class names, not missing or null"),
    (["zero", "one"], "the top level must be an object with 'classnames' and 'templates', not a list"),
    ({"classnames": ["zero"], "templates": "a photo of {}"}, "'templates' must be a non-empty list of templates"),
    ({"classnames": ["zero"], "templates": [7]}, "'templates' must hold strings: item 0 is a number 7"),
    ({"classnames": ["zero"], "templates": ["{} or {}"]},
     "'templates' must each hold exactly one '{}' slot: item 0 '{} or {}' has {}, {}"),
    ({"classnames": ["zero"], "templates": ["a {}", "a {name}"]},
     "'templates' must each hold exactly one '{}' slot: item 1 'a {name}' has {name}"),
    ({"classnames": ["zero"], "templates": ["no slot"]},
     "'templates' must each hold exactly one '{}' slot: item 0 'no slot' has none"),
    ({"classnames": ["zero"], "templates": ["a {"]},
     "'templates' must each hold exactly one '{}' slot: item 0 'a {' has a stray brace"),
])
def test_zeroshot_prompts_are_checked(tmp_path, prompts, why):
    (tmp_path / "zeroshot.json").write_text(json.dumps(prompts))
    with pytest.raises(DataError) as err:
        find_zeroshot([tmp_path / "shard.tar"])
    assert _one_line(str(err.value)).startswith(f"{tmp_path / 'zeroshot.json'}: {why}")


def test_zeroshot_json_nested_too_deep_is_not_valid_json(tmp_path):
    (tmp_path / "zeroshot.json").write_text("[" * 100_000)
    with pytest.raises(DataError) as err:
        find_zeroshot([tmp_path / "shard.tar"])
    assert _one_line(str(err.value)).startswith(f"{tmp_path / 'zeroshot.json'} is not valid JSON: ")


def test_eval_and_data_check_refuse_bad_prompts(tmp_path, capsys):
    from infcl_ds.data import build_eval_data
    split = tmp_path / "test"
    split.mkdir()
    _shard(split / "shard.tar", [{"png": _png(), "txt": b"a zero", "cls": b"0"}])
    sound = {"classnames": ["zero", "one"], "templates": ["a photo of a {}.", "a {{literal}} {}"]}
    (tmp_path / "zeroshot.json").write_text(json.dumps(sound))
    assert build_eval_data(split, image_size=8, tokenizer=None).classnames == ["zero", "one"]
    assert data_check(capsys, "data.source=synthetic", f"data.eval={split}")[0] == 0
    (tmp_path / "zeroshot.json").write_text(json.dumps({"classnames": "zero", "templates": ["{}"]}))
    with pytest.raises(DataError, match="'classnames' must be a non-empty list"):
        build_eval_data(split, image_size=8, tokenizer=None)  # what `infcl-ds eval` and the trainer read
    code, out = data_check(capsys, "data.source=synthetic", f"data.eval={split}")
    assert code == 2
    assert _one_line(out.err) == (f"infcl-ds data check: {tmp_path / 'zeroshot.json'}: 'classnames' must be a "
                                  "non-empty list of class names, not a string 'zero'")


def test_eval_drops_samples_whose_label_is_no_class(tmp_path):
    import torch
    from infcl_ds.data import build_eval_data
    labels = [b"0", b"1", b"7", b"-1", b"1e400", b'{"label": 1}']
    _shard(tmp_path / "shard.tar", [{"png": _png(), "txt": b"a digit", "cls": label} for label in labels])
    (tmp_path / "zeroshot.json").write_text(json.dumps({"classnames": ["zero", "one"], "templates": ["{}"]}))
    data = build_eval_data(tmp_path, image_size=8, batch_size=4, workers=0,
                           tokenizer=lambda texts: torch.zeros(len(texts), 4, dtype=torch.int64))
    assert torch.cat([batch_labels for _, batch_labels, _ in data]).tolist() == [0, 1, 1] and data.skipped == 3


# -- CSVs -----------------------------------------------------------------------------------

def test_an_unclosed_quote_is_named_where_it_opens(tmp_path, capsys):
    # A caption's own line breaks are read as they are...
    path = _csv(tmp_path, b'a.png,"two lines,\nof one caption"\na.png,"three\nlines\nhere"\n')
    assert CsvSource(path, "filepath", "title").captions == ["two lines,\nof one caption", "three\nlines\nhere"]
    assert data_check(capsys, "data.source=csv", f"data.train={path}")[0] == 0
    # ... a quote left open, which swallows the rows after it into one caption, is named.
    rows = [f"a.png,caption {i}\n" for i in range(80)]
    rows[3] = 'a.png,"a quote that is never closed\n'
    path = _csv(tmp_path, "".join(rows).encode())
    expected = f"CSV {path} line 5: a quoted field opened on this line runs to line 81"
    with pytest.raises(DataError) as err:
        CsvSource(path, "filepath", "title")
    assert _one_line(str(err.value)).startswith(expected) and "a quote left unclosed?" in str(err.value)
    code, out = data_check(capsys, "data.source=csv", f"data.train={path}")
    assert code == 2 and _one_line(out.err).startswith(f"infcl-ds data check: {expected}")


def test_a_nul_byte_is_named_by_line(tmp_path, capsys):
    path = _csv(tmp_path, b"a.png,fine\na\0.png,a NUL in the path\n")
    expected = f"CSV {path} line 3: holds a NUL byte"
    with pytest.raises(DataError, match="^" + expected):
        CsvSource(path, "filepath", "title")
    code, out = data_check(capsys, "data.source=csv", f"data.train={path}")
    assert code == 2 and _one_line(out.err).startswith(f"infcl-ds data check: {expected}")


def test_a_separator_of_several_characters_is_named(tmp_path):
    path = _csv(tmp_path, b"a.png,fine\n")
    with pytest.raises(DataError) as err:
        CsvSource(path, "filepath", "title", separator="||")
    assert _one_line(str(err.value)) == f"the separator of CSV {path} must be one character, got '||'"


def test_latin1_captions_are_named_by_line_in_the_trainers_reader(tmp_path):
    path = _csv(tmp_path, b"a.png,fine\na.png,caf\xe9 au lait\n")
    with pytest.raises(DataError) as err:
        CsvSource(path, "filepath", "title")
    assert _one_line(str(err.value)) == f"CSV {path} is not UTF-8: byte 0xe9 on line 3"


def test_a_header_only_csv_is_refused(tmp_path, capsys):
    path = _csv(tmp_path, b"\n\n")
    code, out = data_check(capsys, "data.source=csv", f"data.train={path}")
    assert code == 2 and _one_line(out.err) == f"infcl-ds data check: CSV {path} has no rows under its header"
    with pytest.raises(DataError, match="has no rows under its header"):
        CsvSource(path, "filepath", "title")


def test_unusable_rows_are_skipped_in_training_and_named_by_data_check(tmp_path, capsys):
    too_long = "x" * (MAX_TEXT_BYTES + 1)
    path = _csv(tmp_path, (f"a.png,fine\n,no path\na.png,\na.png\na.png,one,two\na.png,{too_long}\n"
                           ",again\n,and again\na.png,fine too\n").encode())
    source = CsvSource(path, "filepath", "title")
    assert sorted(source.unusable) == [1, 2, 3, 4, 5, 6, 7] and len(source) == 9
    with pytest.raises(SkipSample, match=f"a caption of {MAX_TEXT_BYTES + 1:,} bytes, over the limit"):
        source.load_encoded(5)
    sample, skipped = load_or_replace(source.load_encoded, len(source), 1)
    assert skipped == 1 and sample.caption == "fine too"  # the next usable row, counted once
    code, out = data_check(capsys, "data.source=csv", f"data.train={path}")
    assert code == 0  # a warning: training skips and counts them
    assert _one_line(out.err) == (
        f"infcl-ds data check: warning: CSV {path}: 7 of 9 row(s) the trainer skips and counts: line 3 (no image "
        "path), line 4 (empty caption), line 5 (1 field(s) where the header has 2), line 6 (3 field(s) where the "
        f"header has 2), line 7 (a caption of {MAX_TEXT_BYTES + 1:,} bytes, over the limit of {MAX_TEXT_BYTES:,} "
        "(MAX_TEXT_BYTES)), and 2 more")
    only_bad = _csv(tmp_path, b",no path\na.png,\n", name="bad.csv")
    code, out = data_check(capsys, "data.source=csv", f"data.train={only_bad}")
    assert code == 2 and _one_line(out.err).endswith("line 3 (empty caption): not one row is usable"), out.err


def test_data_check_of_a_bad_csv_is_one_line_and_exit_2_end_to_end(tmp_path):
    path = _csv(tmp_path, b"a.png,fine\na\0.png,NUL\n")
    code, err = _cli("data", "check", "--config", "ds_configs/recipes/tiny-cpu.yaml", "--set", "data.eval=null",
                     "--set", "data.source=csv", "--set", f"data.train={path}")
    assert code == 2 and _one_line(err) == f"infcl-ds data check: CSV {path} line 3: holds a NUL byte (a binary " \
                                           "file, or UTF-16 text? save it as UTF-8 text)"


# -- shards ---------------------------------------------------------------------------------

def test_oversized_captions_and_labels_in_a_shard_are_skipped_unread(tmp_path):
    huge = b"y" * (MAX_TEXT_BYTES + 1)
    path = _shard(tmp_path / "s.tar", [{"png": _png(), "txt": b"one", "cls": b"1"},
                                       {"png": _png(), "txt": huge, "cls": b"1"},
                                       {"png": _png(), "txt": b"two", "cls": huge},
                                       {"png": _png(), "txt": b"three", "cls": b"3"}])
    source = TarSource(path)
    with pytest.raises(SkipSample, match=rf"^caption member of {MAX_TEXT_BYTES + 1:,} bytes, over the limit of "
                                         rf"{MAX_TEXT_BYTES:,} \(MAX_TEXT_BYTES\), in shard {path}$"):
        source.load_encoded(1)
    sample, skipped = load_or_replace(source.load_encoded, len(source), 1)
    assert sample.caption == "two" and skipped == 1  # replaced by the next usable sample, counted
    assert source.load_encoded(2).caption == "two"  # training does not read labels
    with pytest.raises(SkipSample, match="^label member of"):
        source.load(2, with_label=True)


def test_data_check_refuses_what_training_refuses_once_its_ranks_start(tmp_path, capsys):
    """Each in the trainer's own words, from the check the trainer runs."""
    from infcl_ds.data import build_eval_data
    empty = _shard(tmp_path / "empty.tar", [])
    with pytest.raises(DataError) as err:
        TarSource(empty)  # the trainer's source
    assert str(err.value) == f"no samples in shards {empty}"
    code, out = data_check(capsys, "data.source=webdataset", f"data.train={empty}")
    assert code == 2 and _one_line(out.err) == f"infcl-ds data check: {err.value}"

    ten = _shard(tmp_path / "ten.tar", [{"png": _png(), "txt": b"a caption"}] * 10)
    table = _csv(tmp_path, b"a.png,a caption\n" * 10)
    too_few = "infcl-ds data check: 10 samples do not fill one global batch of 512 (batch.global): not one " \
              "training step could run"
    for source, train in (("webdataset", ten), ("csv", table)):
        code, out = data_check(capsys, f"data.source={source}", f"data.train={train}", "batch.global=512",
                               "batch.chunk=64")
        assert code == 2 and _one_line(out.err) == too_few
        assert data_check(capsys, f"data.source={source}", f"data.train={train}", "batch.global=10",
                          "batch.chunk=5")[0] == 0

    split = tmp_path / "test"
    split.mkdir()
    _shard(split / "shard.tar", [{"png": _png(), "txt": b"a zero", "cls": b"0"}, {"png": _png(), "txt": b"no label"}])
    (split / "zeroshot.json").write_text(json.dumps({"classnames": ["zero"], "templates": ["a {}"]}))
    with pytest.raises(DataError) as err:
        build_eval_data(split, image_size=8, tokenizer=None)  # what the trainer and `infcl-ds eval` read
    assert str(err.value) == f"shard {split / 'shard.tar'} has samples without a .cls or .json label member"
    code, out = data_check(capsys, "data.source=synthetic", f"data.eval={split}")
    assert code == 2 and _one_line(out.err) == f"infcl-ds data check: {err.value}"


def _cache_file(tmp_path):
    (cache,) = (tmp_path / "cache" / "tar-index").iterdir()
    return cache


def _npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


def _forged(path, spans, offset_shift: int, size_shift: int = 0) -> bytes:
    """A cache file for `path` whose spans are moved, with a header and checksum to match."""
    forged = spans.copy()
    forged[:, :, 0] += offset_shift
    forged[:, :, 1] += size_shift
    payload = forged.astype("<i8").tobytes()
    return cache_header(path.stat(), payload) + payload


@pytest.mark.parametrize("damage", ["cut", "reshaped", "pickle", "empty", "other shard", "forged past 16 TiB",
                                    "forged past the end", "forged overflowing"])
def test_a_damaged_index_cache_is_rebuilt(tmp_path, damage):
    path = _shard(tmp_path / "s.tar", [{"png": _png(), "txt": f"caption {i}".encode()} for i in range(5)])
    spans, cut = shard_spans(path)
    assert not cut and len(spans) == 5
    cache = _cache_file(tmp_path)
    whole = cache.read_bytes()
    other = _shard(tmp_path / "other.tar", [{"png": _png(), "txt": b"x"} for _ in range(3)])
    shard_spans(other)
    other_cache = next(p for p in (tmp_path / "cache" / "tar-index").iterdir() if p != cache)
    cache.write_bytes({"cut": whole[:len(whole) // 2],
                       "reshaped": _npy(spans.reshape(-1, 2)),
                       "pickle": _npy(np.array([{"a": 1}], dtype=object)),
                       "empty": b"",
                       "other shard": other_cache.read_bytes(),
                       # a read would seek past the file system's largest offset: OSError
                       "forged past 16 TiB": _forged(path, spans, 1 << 44),
                       "forged past the end": _forged(path, spans, 0, path.stat().st_size),
                       "forged overflowing": _forged(path, spans, 0, (1 << 63) - 1 - int(spans[..., 1].max())),
                       }[damage])
    again, cut = shard_spans(path)
    assert not cut and np.array_equal(again, spans)
    assert TarSource(path).load_encoded(4).caption == "caption 4"
    assert cache.read_bytes() == whole  # rewritten, and verifies
    assert np.array_equal(shard_spans(path)[0], spans)


# -- file names in messages ----------------------------------------------------------------

# A line break and a terminal escape (red text) in a file name: a message naming the file as it
# is would split in two, and the terminal would obey the escape.
HOSTILE_NAME, HOSTILE_SHOWN = "a\n\x1b[31mred", "a\\n\\x1b[31mred"


def test_hostile_shard_names_are_shown_escaped(tmp_path, capsys):
    folder = tmp_path / "shards"
    folder.mkdir()
    os.mkfifo(folder / f"{HOSTILE_NAME}.tar")
    expected = f"shard {folder}/{HOSTILE_SHOWN}.tar is a FIFO, not a regular file: refused"
    code, out = data_check(capsys, "data.source=webdataset", f"data.train={folder}")
    assert code == 2 and _one_line(out.err) == f"infcl-ds data check: {expected}"
    with pytest.raises(DataError) as err:  # the trainer's source
        TarSource(folder)
    assert str(err.value) == expected
    (folder / f"{HOSTILE_NAME}.tar").unlink()
    cut = folder / f"{HOSTILE_NAME}.tar"
    whole = _shard(tmp_path / "whole.tar", [{"png": _png(), "txt": b"caption"}] * 3).read_bytes()
    cut.write_bytes(whole[:4 * 512 + 100])  # sample 0 (2 members of a header and a data block) and a cut header
    assert len(TarSource(folder)) == 1
    warning = _one_line(capsys.readouterr().err)
    assert warning.startswith(f"infcl-ds: warning: shard {folder}/{HOSTILE_SHOWN}.tar is cut short")
    code, out = data_check(capsys, "data.source=webdataset", f"data.train={folder}")
    assert code == 2 and _one_line(out.err).startswith(f"infcl-ds data check: shard {folder}/{HOSTILE_SHOWN}.tar is "
                                                       "cut short")


def test_hostile_csv_and_image_names_are_shown_escaped(tmp_path):
    table = tmp_path / f"{HOSTILE_NAME}.csv"
    table.write_text("filepath,title\n")
    with pytest.raises(DataError) as err:
        CsvSource(table, "filepath", "title")
    assert str(err.value) == f"CSV {tmp_path}/{HOSTILE_SHOWN}.csv has no rows under its header"
    os.mkfifo(tmp_path / f"{HOSTILE_NAME}.png")
    table.write_text(f'filepath,title\n"{HOSTILE_NAME}.png",a caption\n')
    with pytest.raises(SkipSample) as skip:
        CsvSource(table, "filepath", "title").load_encoded(0)
    assert str(skip.value) == f"image {tmp_path}/{HOSTILE_SHOWN}.png is a FIFO, not a regular file"


# -- output directories ---------------------------------------------------------------------

def test_digits_into_a_path_that_is_not_a_directory_is_one_line(tmp_path, capsys):
    from infcl_ds.data.commands.digits import main
    assert main(["--out", "/dev/null"]) == 2
    assert _one_line(capsys.readouterr().err) == "infcl-ds data digits: --out /dev/null is not a directory"
    (tmp_path / "file").write_text("")
    assert main(["--out", str(tmp_path / "file" / "digits")]) == 2
    assert _one_line(capsys.readouterr().err).startswith(f"infcl-ds data digits: cannot make the directory --out "
                                                         f"{tmp_path / 'file' / 'digits'}: [Errno 20] Not a directory")
    for args, why in ((["--holdout", "0"], "--holdout: must be a finite number above 0"),
                      (["--holdout", "0.001"], "--holdout: must be 0.01 to 0.99"),
                      (["--image-size", "0"], "--image-size: must be at least 1"),
                      (["--seed", "-1"], "--seed: must be 0 to 2**32 - 1")):
        with pytest.raises(SystemExit, match="2"):
            main(["--out", str(tmp_path / "digits"), *args])
        assert _one_line(capsys.readouterr().err).startswith(f"infcl-ds data digits: argument {why}")
