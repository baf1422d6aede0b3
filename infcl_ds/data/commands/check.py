"""`infcl-ds data check --config RECIPE [--set key=value ...]`: the recipe's data paths exist,
checked before a launch (launch/train.sh, mpi.sh and slurm.sbatch run it on the launching node)
so that a typo fails in a second instead of after every rank has built its engine.

Cheap: shard patterns are expanded and every shard must exist and be a regular file (no tar
is read), a CSV must exist, be UTF-8 throughout (a byte order mark is fine) and have the
recipe's image and caption columns and a row under them, an evaluation split must have its
shards and sound zero-shot prompts. The trainer runs the same check at start-up and checks the
contents as it reads them.

The command also refuses, with the trainer's own checks, what the trainer would refuse only
once its ranks have started: too few samples for one global batch (none at all in the shards),
an evaluation split with a sample that has no label, and data.gpu_jpeg_library=nvimgcodec
without nvImageCodec installed. It indexes every training and evaluation shard (tar headers
only, cached for the trainer): a training shard cut short is named, since training would only
warn and read what it holds. It reads every CSV row as the trainer does (a malformed one, such
as a field over MAX_CSV_FIELD_CHARS, a NUL or a quote left open, is named), warns of the rows
training would skip and count (wrong field count, no image path, an empty or oversized caption:
lines and count; refused only when no row is usable), and looks at (stats, never reads) every
row's image: one that is a FIFO, a device or over MAX_IMAGE_BYTES is named, since training
would only skip it; a missing one is left to the trainer's skip count.
"""
import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from ...shown import shown
from ..decoding.nvimgcodec_decode import require_gpu_jpeg_library
from ..errors import DataError
from ..eval_split import find_zeroshot, labelled_split
from ..sources.csv_source import (ROWS_NAMED, CsvColumns, bad_rows_message, csv_rows, csv_separator, require_columns,
                                  require_rows, scan_utf8)
from ..sources.sampler import require_steps
from ..sources.samples import MAX_IMAGE_BYTES, not_a_sample_file
from ..sources.tar_index import TarIndex, cut_short_message
from ..sources.webdataset_source import expand_shards, shard_index


def check_recipe_data(recipe) -> str:
    """The command's check of the recipe's data (check_paths with images), its samples against
    one global batch (batch.global) and the GPU decoder's JPEG library: a one-line summary, or
    the DataError the trainer would raise."""
    require_gpu_jpeg_library(recipe.data)
    return check_paths(recipe.data, images=True, global_batch=recipe.batch.global_size)


def check_paths(data, images: bool = False, global_batch: Optional[int] = None) -> str:
    """A one-line summary of what the recipe's `data` section points at; DataError otherwise.
    With `images`, the command's check, not the trainer's start-up (where millions of stats on
    every rank would be slow): every shard is indexed and every CSV row read and its image
    stat'ed (check_csv_rows), the evaluation split's labels are checked, and with `global_batch`
    the samples must fill one global batch."""
    samples = None  # counted with `images`
    if data.source == "synthetic":
        samples = data.synthetic_size
        found = f"synthetic data, {samples} samples"
    elif data.source == "webdataset":
        if images:
            index = check_shards_whole(data.train)
            samples = len(index)
            found = f"{len(index.shards)} shards ({samples} samples)"
        else:
            found = f"{len(expand_shards(data.train))} shards"
    else:
        rows = check_csv(data.train, data.csv_img_key, data.csv_caption_key, data.csv_separator)
        if images:
            samples, skipped = check_csv_rows(data.train, data.csv_img_key, data.csv_caption_key, data.csv_separator)
            if skipped:
                print(f"infcl-ds data check: warning: {skipped}", file=sys.stderr)
        found = f"CSV {shown(data.train, quote=False)} ({rows} lines)"
    if global_batch is not None and samples is not None:
        require_steps(samples, global_batch)
    if data.eval:
        if images:
            source, _ = labelled_split(data.eval)
            eval_shards = source.index.shards
        else:
            eval_shards = expand_shards(data.eval)
            find_zeroshot(eval_shards)  # beside the shards or one level up, as evaluation looks
        found += f"; evaluation split {shown(data.eval, quote=False)} ({len(eval_shards)} shards)"
    return found


def check_shards_whole(spec) -> TarIndex:
    """The index of the spec's shards (shard_index: DataError if they hold no sample); DataError
    naming the first shard that is cut short (training would only warn and read what it holds).
    Reads the tar headers only, and leaves the index in the cache the trainer reads."""
    index = shard_index(spec)
    if index.cut_short:
        raise DataError(cut_short_message(*index.cut_short[0]))
    return index


def check_csv(path, img_key: str, caption_key: str, separator: Optional[str] = None) -> int:
    """The CSV exists, decodes as UTF-8 (the first bad byte's line named), has both columns in
    its header and a row under it; returns its number of lines after the header. One pass over
    the file's bytes; only the header and the first row are parsed."""
    path = Path(path)
    separator = csv_separator(path, separator)
    newlines = scan_utf8(path)
    with csv_rows(path, separator) as rows:
        require_columns(path, rows.header, (img_key, caption_key), separator,
                        "; set data.csv_img_key / data.csv_caption_key / data.csv_separator")
        require_rows(path, next(iter(rows), None) is not None)
    return max(0, newlines - 1)


def check_csv_rows(path, img_key: str, caption_key: str,
                   separator: Optional[str] = None) -> Tuple[int, Optional[str]]:
    """(the CSV's rows: the trainer's samples, a warning or None); DataError naming the first row
    (line, path, why) whose image the trainer would refuse to read: not a regular file (a FIFO
    blocks, a device never ends) or over MAX_IMAGE_BYTES, or when no row is usable. Rows the
    trainer skips and counts (CsvColumns.problem) are the one-line warning, naming the first
    few lines, why, and their count (None when there are none): a large caption file with a few
    empty captions still trains, as OpenCLIP's would. Only stats: no image is opened, so this
    cannot block either."""
    path = Path(path)
    separator = csv_separator(path, separator)
    bad, total, first_bad = 0, 0, []
    with csv_rows(path, separator) as rows:
        columns = CsvColumns(rows.header, img_key, caption_key)
        for line, fields in rows:
            total += 1
            why = columns.problem(fields)
            if why is None:
                check_image(path, line, fields[columns.image])
                continue
            bad += 1
            if len(first_bad) < ROWS_NAMED:
                first_bad.append((line, why))
    if not bad:
        return total, None
    message = bad_rows_message(path, bad, total, first_bad)
    if bad == total:
        raise DataError(f"{message}: not one row is usable")
    return total, message


def check_image(path: Path, line: int, name: str) -> None:
    """DataError if the CSV's row at `line` names an image the trainer would refuse to read."""
    try:
        info = os.stat(path.parent / name)
    except OSError:
        return  # missing or unreadable: skipped and counted in training
    why = not_a_sample_file(info)
    if why is not None:
        raise DataError(f"CSV {shown(path, quote=False)} line {line}: image {shown(name, quote=False)} {why}; only "
                        f"regular files of at most {MAX_IMAGE_BYTES >> 20} MiB are read as samples")


def main(argv: Optional[List[str]] = None) -> int:
    from ...config import RecipeError, load_recipe
    p = argparse.ArgumentParser(prog="infcl-ds data check", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="the recipe (YAML) whose data to check")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe override, as for training (repeatable)")
    args = p.parse_args(argv)
    try:
        print(f"data: {check_recipe_data(load_recipe(args.config, args.set))}")
    except (RecipeError, DataError) as err:
        print(f"infcl-ds data check: {err}", file=sys.stderr)
        return 2
    return 0
