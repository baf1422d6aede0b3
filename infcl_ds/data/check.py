"""`infcl-ds data check --config RECIPE [--set key=value ...]`: the recipe's data paths exist,
checked before a launch (launch/train.sh, mpi.sh and slurm.sbatch run it on the launching node)
so that a typo fails in a second instead of after every rank has built its engine.

Cheap: shard patterns are expanded and every shard must exist (no tar is read), a CSV must
exist, be UTF-8 throughout and have the recipe's image and caption columns, an evaluation
split must have its shards and zero-shot prompts. The trainer runs the same check at start-up
and checks the contents as it reads them.
"""
import argparse
import codecs
import csv
import io
import sys
from pathlib import Path
from typing import List, Optional

from .errors import DataError
from .eval import find_zeroshot
from .sources import csv_separator, require_columns
from .webdataset_source import expand_shards


def check_paths(data) -> str:
    """A one-line summary of what the recipe's `data` section points at; DataError otherwise."""
    if data.source == "synthetic":
        found = f"synthetic data, {data.synthetic_size} samples"
    elif data.source == "webdataset":
        found = f"{len(expand_shards(data.train))} shards"
    else:
        rows = check_csv(data.train, data.csv_img_key, data.csv_caption_key, data.csv_separator)
        found = f"CSV {data.train} ({rows} lines)"
    if data.eval:
        eval_shards = expand_shards(data.eval)
        find_zeroshot(eval_shards)  # beside the shards or one level up, as evaluation looks
        found += f"; evaluation split {data.eval} ({len(eval_shards)} shards)"
    return found


def check_csv(path, img_key: str, caption_key: str, separator: Optional[str] = None) -> int:
    """The CSV exists, decodes as UTF-8 (the first bad byte's line named) and its header has
    both columns; returns its number of lines after the header. One pass over the file's bytes."""
    path = Path(path)
    separator = csv_separator(path, separator)
    decoder, line, header = codecs.getincrementaldecoder("utf-8")(), 1, None  # line: 1 + newlines read
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


def main(argv: Optional[List[str]] = None) -> int:
    from ..config import RecipeError, load_recipe
    p = argparse.ArgumentParser(prog="infcl-ds data check", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    try:
        print(f"data: {check_paths(load_recipe(args.config, args.set).data)}")
    except (RecipeError, DataError) as err:
        print(f"infcl-ds data check: {err}", file=sys.stderr)
        return 2
    return 0
