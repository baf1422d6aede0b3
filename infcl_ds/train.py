"""`infcl-ds train --config RECIPE.yaml [--set key=value ...] [--resume latest | --restart]`.

Also ``deepspeed [launcher flags] --module infcl_ds.train --config RECIPE.yaml``, ``mpirun``
and ``srun`` (see docs/multi-node.md). One optimizer step per global batch: the engine encodes
the local batch in chunks, computes the exact loss over all ranks with the ring, re-encodes
and steps (infcl_ds/engine/step.py). The run directory (recipe key ``output_dir``) holds the
resolved recipe, checkpoints, metrics.csv / eval.csv / TensorBoard and metrics.png, of one run:
a start without --resume into a directory that holds a run is refused, and --restart moves
that run to OUTPUT_DIR.old-<UTC time> first (training/preflight.py); a start into a directory
whose run is still going is refused, with --resume too (training/run_lock.py). The exit
statuses: training/exits.py.
"""
import argparse
import os
import sys
import time
from typing import List, Optional

from .checkpoint.safe_load import TRUST_FLAG, TRUST_HELP
from .config import RecipeError, load_recipe
from .parallel.ring import is_collective_failure
from .training.distributed import collective_timeout_s, leave_distributed, make_timeout_env_importable
from .training.exits import DONE_EXIT, EXIT_STATUSES, USER_ERROR_EXIT, USER_ERRORS, exit_collective_failure, \
    exit_now, one_line
from .training.launcher_watch import watch_launcher
from .training.stopped_rank_watch import StoppedRankWatch
from .training.run_lock import RunDirBusy, take_if_owner


def parse_args(argv: Optional[List[str]]):
    parser = argparse.ArgumentParser(prog="infcl-ds train", description=__doc__.split("\n\n")[0],
                                     epilog=EXIT_STATUSES)
    parser.add_argument("--config", required=True, help="the recipe (YAML); see ds_configs/recipes/")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe key, e.g. --set batch.global=1024 (repeatable)")
    parser.add_argument("--resume", default=None, help="'latest' or a checkpoint tag in OUTPUT_DIR/checkpoints")
    parser.add_argument("--restart", action="store_true",
                        help="start over in an OUTPUT_DIR that holds a run: its files are moved to "
                             "OUTPUT_DIR.old-<UTC time> first (nothing is deleted)")
    parser.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    parser.add_argument("--allow-recipe-change", action="store_true",
                        help="resume although the recipe changed in a way that alters the run (schedule, batch, "
                             "optimizer, model, data order); the changes are logged")
    parser.add_argument("--local_rank", type=int, default=None, help="set by the deepspeed launcher (unused: LOCAL_RANK)")
    return parser.parse_args(argv)


def use_expandable_segments() -> None:
    """torch's caching allocator with expandable segments, unless the user configured it:
    it keeps less in reserve beside the same allocated peak
    (fragmentation between chunks of different sizes; docs/planner.md), which the planner's
    runtime reserve assumes. Read when CUDA first allocates, so before any device work."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def main(argv: Optional[List[str]] = None) -> int:
    use_expandable_segments()
    args = parse_args(argv)
    try:
        make_timeout_env_importable()  # before deepspeed is imported
        recipe = load_recipe(args.config, args.set)
    except (RecipeError, ValueError) as err:
        print(f"infcl-ds train: {err}", file=sys.stderr)
        return USER_ERROR_EXIT
    if args.restart and (args.resume or recipe.checkpoint.resume):
        print(f"infcl-ds train: --restart starts over and "
              f"{'--resume' if args.resume else 'checkpoint.resume'} continues a run: give one of them",
              file=sys.stderr)
        return USER_ERROR_EXIT
    try:
        run_lock = take_if_owner(recipe.output_dir)  # before DeepSpeed's import: a busy directory costs seconds
    except RunDirBusy as err:
        print(f"infcl-ds train: {one_line(err)}", file=sys.stderr)
        return USER_ERROR_EXIT
    from .training.trainer import Trainer  # imports deepspeed: only after make_timeout_env_importable
    start = time.perf_counter()
    timeout_s = collective_timeout_s(recipe.distributed.timeout)
    watch = watch_launcher()  # from here on, a rank whose deepspeed launcher is killed stops
    stopped_ranks = StoppedRankWatch(os.environ.get("RANK", "?"), lambda: watch.where(), timeout_s).start()
    try:
        trainer = Trainer(recipe, resume=args.resume, trust_checkpoint=args.trust_checkpoint,
                          allow_recipe_change=args.allow_recipe_change, restart=args.restart, watch=watch,
                          run_lock=run_lock)
    except USER_ERRORS as err:  # found by every rank alike, before any work
        print(f"infcl-ds train: {one_line(err)}", file=sys.stderr)
        if joined_job():
            # No teardown of the process group: a peer that has already left (rank 0 right after
            # sharing a refusal) makes gloo's teardown abort this rank (SIGABRT, not status 2).
            exit_now(USER_ERROR_EXIT)
        return USER_ERROR_EXIT
    except Exception as err:  # noqa: BLE001 - a peer that failed while the engine was built
        if not is_collective_failure(err):
            raise
        exit_collective_failure(err, os.environ.get("RANK", "?"), "start-up", timeout_s)
    try:
        trainer.run()
        stopped_ranks.close()
        trainer.phase = "leaving the job"
        leave_distributed()  # this process joined the job and now exits: it tears its end down
    except USER_ERRORS + (OSError,) as err:  # OSError: a full disk or a vanished file system
        print(f"infcl-ds train: rank {trainer.rank}, {trainer.phase}: {one_line(err)}", file=sys.stderr)
        exit_now(USER_ERROR_EXIT)
    except Exception as err:  # noqa: BLE001 - collective failures become one line; the rest propagates
        if not is_collective_failure(err):
            raise
        exit_collective_failure(err, trainer.rank, trainer.phase, timeout_s)
    if trainer.rank == 0:
        print(f"train time: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return DONE_EXIT


def joined_job() -> bool:
    import torch.distributed
    return torch.distributed.is_available() and torch.distributed.is_initialized()


if __name__ == "__main__":
    sys.exit(main())
