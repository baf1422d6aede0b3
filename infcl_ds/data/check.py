"""`infcl-ds data check --config RECIPE [--set key=value ...]`: the recipe's data paths exist,
checked before a launch (launch/train.sh, mpi.sh and slurm.sbatch run it on the launching node)
so that a typo fails in a second instead of after every rank has built its engine.

Cheap: shard patterns are expanded and every shard must exist (no tar is read), a CSV must
exist, an evaluation split must have its shards and zero-shot prompts. The trainer checks the contents.
"""
import argparse
import sys
from pathlib import Path
from typing import List, Optional

from .errors import DataError
from .sources import check_source_keys


def check_paths(data) -> str:
    """A one-line summary of what the recipe's `data` section points at; DataError otherwise."""
    check_source_keys(data.source, data.train)
    if data.source == "synthetic":
        found = f"synthetic data, {data.synthetic_size} samples"
    elif data.source == "webdataset":
        from .webdataset_source import expand_shards
        found = f"{len(expand_shards(data.train))} shards"
    else:
        if not Path(data.train).is_file():
            raise DataError(f"CSV file {data.train} does not exist")
        found = f"CSV {data.train}"
    if data.eval:
        from .eval import find_zeroshot
        from .webdataset_source import expand_shards
        eval_shards = expand_shards(data.eval)
        find_zeroshot(eval_shards)  # beside the shards or one level up, as evaluation looks
        found += f"; evaluation split {data.eval} ({len(eval_shards)} shards)"
    return found


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
