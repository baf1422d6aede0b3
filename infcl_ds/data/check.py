"""`infcl-ds data check --config RECIPE [--set key=value ...]`: the recipe's data paths exist,
checked before a launch (launch/train.sh, mpi.sh and slurm.sbatch run it on the launching node)
so that a typo fails in a second instead of after every rank has built its engine.

Cheap: shard patterns are expanded and every shard must exist and be a regular file (no tar
is read), a CSV must exist, be UTF-8 throughout (a byte order mark is fine) and have the
recipe's image and caption columns, an evaluation split must have its shards and zero-shot
prompts. The trainer runs the same check at start-up and checks the contents as it reads
them. The command also indexes every training shard (tar headers only, cached for the
trainer): one cut short is named, since training would only warn and read what it holds; and
it reads every CSV row as the trainer does (a field over MAX_CSV_FIELD_CHARS is named) and
looks at (stats, never reads) every row's image: one that is a FIFO, a device or over
MAX_IMAGE_BYTES is named, since training would only skip it; a missing one is left to the
trainer's skip count, as before.
"""
import argparse
import codecs
import csv
import io
import os
import sys
from pathlib import Path
from typing import List, Optional

from ..shown import shown
from .errors import DataError
from .eval import find_zeroshot
from .samples import MAX_IMAGE_BYTES, not_a_sample_file
from .sources import CSV_ENCODING, csv_rows, csv_separator, require_columns
from .tar_index import cut_short_message, shard_spans
from .webdataset_source import expand_shards


def check_paths(data, images: bool = False) -> str:
    """A one-line summary of what the recipe's `data` section points at; DataError otherwise.
    With `images`, every CSV row's image is stat'ed too (check_csv_images): the command's
    check, not the trainer's start-up, where millions of stats on every rank would be slow."""
    if data.source == "synthetic":
        found = f"synthetic data, {data.synthetic_size} samples"
    elif data.source == "webdataset":
        shards = expand_shards(data.train)
        found = f"{len(shards)} shards"
        if images:
            found += f" ({check_shards_whole(shards)} samples)"
    else:
        rows = check_csv(data.train, data.csv_img_key, data.csv_caption_key, data.csv_separator)
        if images:
            check_csv_images(data.train, data.csv_img_key, data.csv_separator)
        found = f"CSV {data.train} ({rows} lines)"
    if data.eval:
        eval_shards = expand_shards(data.eval)
        find_zeroshot(eval_shards)  # beside the shards or one level up, as evaluation looks
        found += f"; evaluation split {data.eval} ({len(eval_shards)} shards)"
    return found


def check_shards_whole(shards) -> int:
    """The samples in `shards`; DataError naming the first shard that is cut short (training
    would only warn and read what it holds). Reads the tar headers only, and leaves the index
    in the cache the trainer reads."""
    total = 0
    for shard in shards:
        spans, cut = shard_spans(shard)
        if cut:
            raise DataError(cut_short_message(shard, len(spans)))
        total += len(spans)
    return total


def check_csv(path, img_key: str, caption_key: str, separator: Optional[str] = None) -> int:
    """The CSV exists, decodes as UTF-8 (the first bad byte's line named) and its header has
    both columns; returns its number of lines after the header. One pass over the file's bytes."""
    path = Path(path)
    separator = csv_separator(path, separator)
    decoder, line, header = codecs.getincrementaldecoder(CSV_ENCODING)(), 1, None  # line: 1 + newlines read
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            try:
                text = decoder.decode(block)
            except UnicodeDecodeError as err:
                line += err.object[:err.start].count(b"\n")
                raise DataError(f"CSV {path} is not UTF-8: byte {err.object[err.start]:#04x} on line {line}") from None
            if header is None:
                header = text
            elif "\n" not in header:
                header += text
            line += block.count(b"\n")
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"CSV {path} is not UTF-8: it ends inside a multi-byte character") from None
    fields = next(csv.reader(io.StringIO(header or ""), delimiter=separator), [])
    require_columns(path, fields, (img_key, caption_key), separator,
                    "; set data.csv_img_key / data.csv_caption_key / data.csv_separator")
    return max(0, line - 2)  # the newlines after the header's


def check_csv_images(path, img_key: str, separator: Optional[str] = None) -> None:
    """DataError naming the first row (line, path, why) whose image the trainer would refuse
    to read: not a regular file (a FIFO blocks, a device never ends) or over MAX_IMAGE_BYTES.
    Only stats: no image is opened, so this cannot block either."""
    path = Path(path)
    separator = csv_separator(path, separator)
    with csv_rows(path, separator) as rows:
        for row in rows:
            name = row.get(img_key)
            if not name:
                continue
            try:
                info = os.stat(path.parent / name)
            except OSError:
                continue  # missing or unreadable: skipped and counted in training
            why = not_a_sample_file(info)
            if why is not None:
                raise DataError(f"CSV {path} line {rows.reader.line_num}: image {shown(name, quote=False)} {why}; only regular "
                                f"files of at most {MAX_IMAGE_BYTES >> 20} MiB are read as samples")


def main(argv: Optional[List[str]] = None) -> int:
    from ..config import RecipeError, load_recipe
    p = argparse.ArgumentParser(prog="infcl-ds data check", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    try:
        print(f"data: {check_paths(load_recipe(args.config, args.set).data, images=True)}")
    except (RecipeError, DataError) as err:
        print(f"infcl-ds data check: {err}", file=sys.stderr)
        return 2
    return 0
