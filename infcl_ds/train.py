"""`infcl-ds train --config RECIPE.yaml [--set key=value ...] [--resume latest]`.

Also ``deepspeed [launcher flags] --module infcl_ds.train --config RECIPE.yaml``, ``mpirun``
and ``srun`` (see docs/multi-node.md). One optimizer step per global batch: the engine encodes
the local batch in chunks, computes the exact loss over all ranks with the ring, re-encodes
and steps (infcl_ds/engine/step.py). The run directory (recipe key ``output_dir``) holds the
resolved recipe, checkpoints, metrics.csv / eval.csv / TensorBoard and metrics.png.
"""
import argparse
import json
import math
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import List, Optional

import torch

from .config import Recipe, RecipeError, build_deepspeed_config, check_world, dump_recipe, load_recipe


def parse_args(argv: Optional[List[str]]):
    parser = argparse.ArgumentParser(prog="infcl-ds train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the recipe (YAML); see ds_configs/recipes/")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe key, e.g. --set batch.global=1024 (repeatable)")
    parser.add_argument("--resume", default=None, help="'latest' or a checkpoint tag in OUTPUT_DIR/checkpoints")
    parser.add_argument("--local_rank", type=int, default=None, help="set by the deepspeed launcher (unused: LOCAL_RANK)")
    return parser.parse_args(argv)


def seed_everything(seed: int) -> None:
    import random

    import numpy as np
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """Everything one rank needs for a run; ``run()`` does the steps."""

    def __init__(self, recipe: Recipe, resume: Optional[str] = None):
        import deepspeed.comm as dist

        from .engine import ContrastiveEngine
        from .engine.optim import clip_param_groups
        from .models import create_model, get_tokenizer, model_info
        from .training.distributed import init_distributed

        self.recipe = recipe
        self.device = init_distributed()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        check_world(recipe, self.world)  # same recipe on every rank: all raise, none hangs
        self.run_dir = Path(recipe.output_dir)
        self.checkpoint_dir = self.run_dir / "checkpoints"
        seed_everything(recipe.model.seed)
        model = create_model(recipe.model.name, loss=recipe.model.loss)
        if recipe.model.grad_checkpointing:
            model.set_grad_checkpointing(True)
        self.info = model_info(model)
        self.tokenizer = get_tokenizer(recipe.model.name)
        opt = recipe.optimizer
        # Decay groups on the unwrapped model: under ZeRO-3 a parameter's shape is its shard's.
        optimizer = torch.optim.AdamW(clip_param_groups(model, opt.weight_decay), lr=opt.lr,
                                      betas=tuple(opt.betas), eps=opt.eps)
        self.step_engine = ContrastiveEngine.create(
            model.to(self.device), build_deepspeed_config(recipe, self.world), recipe.batch.chunk,
            optimizer=optimizer, offload_features=recipe.batch.offload_features,
            grad_accum_fp32=recipe.precision.grad_accum_fp32, loss=recipe.model.loss)
        self.data = self._train_data()
        self.eval_data = self._eval_data()
        self.step = 0
        if resume or recipe.checkpoint.resume:
            self._resume(resume or recipe.checkpoint.resume)
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "recipe.yaml").write_text(dump_recipe(recipe))
            (self.run_dir / "run.json").write_text(json.dumps(
                {"world_size": self.world, "device": str(self.device), "model": recipe.model.name,
                 "local_batch": recipe.local_batch(self.world), "steps_per_epoch": self.data.steps_per_epoch}, indent=1))

    # -- construction -------------------------------------------------------------------
    def _train_data(self):
        from .data import build_train_data
        # Raises DataError (missing paths, fewer samples than one global batch) on every rank.
        return build_train_data(self.recipe.data.model_dump(), rank=self.rank, world_size=self.world,
                                local_batch=self.recipe.local_batch(self.world), seed=self.recipe.model.seed,
                                image_size=self.info["image_size"], tokenizer=self.tokenizer,
                                mean=self.info["mean"], std=self.info["std"])

    def _eval_data(self):
        if not self.recipe.data.eval:
            return None
        from .data import build_eval_data
        return build_eval_data(self.recipe.data.eval, image_size=self.info["image_size"], tokenizer=self.tokenizer,
                               batch_size=self.recipe.eval.batch_size, mean=self.info["mean"], std=self.info["std"])

    def _resume(self, tag: str) -> None:
        from .training import checkpoint
        client = checkpoint.load(self.step_engine.engine, self.checkpoint_dir, tag, self.rank)
        self.step = client["step"]
        self.data.load_state_dict(client["data"])

    # -- the loop -------------------------------------------------------------------------
    def _batches(self):
        """Local batches forever, epoch after epoch, from the data's saved position."""
        while True:
            yield from self.data
            self.data.set_epoch(self.data.state_dict()["epoch"] + 1)

    def _skipped_total(self) -> int:
        import deepspeed.comm as dist
        count = torch.tensor([float(self.data.skipped)], device=self.device)
        dist.all_reduce(count)
        return int(count.item())

    def run(self) -> dict:
        from .training import checkpoint
        from .training.metrics import MetricsLogger, Throughput, peak_memory_gib
        r = self.recipe
        logger = MetricsLogger(self.run_dir, self.rank == 0, r.logging.tensorboard, resume_step=self.step)
        bar = self._progress_bar()
        timer, batches = Throughput(), self._batches()
        engine = self.step_engine.engine
        results = {}
        while self.step < r.schedule.steps:
            batch = next(batches)
            lr = engine.get_lr()[0]  # the rate this step uses (the scheduler moves on in step())
            loss = self.step_engine.train_step(batch)
            # An encoded batch finds its undecodable images during the step (data/encoded.py).
            self.data.skipped += getattr(batch, "decode_skipped", 0)
            decode_wait = getattr(batch, "decode_wait_s", 0.0)
            host_bytes = batch.nbytes / len(batch)
            # Dropped before the next is asked for: the data thread fills the next batch while
            # this one trains, so a rank holds two local batches, not three.
            del batch
            self.step += 1
            seconds = timer.lap()
            if self.step % r.logging.every == 0 or self.step == r.schedule.steps:
                row = {"step": self.step, "epoch": self.data.state_dict()["epoch"], "loss": loss.item(),
                       "lr": lr, "logit_scale": self._logit_scale(),
                       "samples_per_s": r.batch.global_size / seconds, "step_s": seconds,
                       "peak_mem_gib": peak_memory_gib(self.device), "skipped": self._skipped_total(),
                       "decode_wait_s": decode_wait, "host_bytes_per_sample": host_bytes}
                logger.log_step(row)
                self._show(bar, row)
            if r.eval.every and self.step % r.eval.every == 0 and self.step < r.schedule.steps:
                logger.log_eval(self.step, self.evaluate())
            if r.checkpoint.every and self.step % r.checkpoint.every == 0 and self.step < r.schedule.steps:
                self._save(checkpoint)
        self._save(checkpoint)
        if self.eval_data is not None:
            results = self.evaluate()
            logger.log_eval(self.step, results)
        if bar is not None:
            bar.close()
        plot = logger.close()
        if self.rank == 0:
            if results:
                (self.run_dir / "eval.json").write_text(json.dumps(results, indent=1))
                from .eval import metric_label
                for key, value in results.items():  # zero-shot top-1 last: the line people look for
                    if key != "zeroshot_top1":
                        print(f"{metric_label(key)}: {value:.4f}")
                print(f"{metric_label('zeroshot_top1')}: {results['zeroshot_top1']:.4f}")
            print(f"run directory: {self.run_dir}" + (f" (curves: {plot})" if plot else ""))
        return results

    def _save(self, checkpoint) -> None:
        client = {"data": self.data.state_dict()}
        checkpoint.save(self.step_engine.engine, self.checkpoint_dir, self.step, client, self.rank,
                        keep=self.recipe.checkpoint.keep)

    def _logit_scale(self) -> float:
        param = self.step_engine.model.logit_scale
        with self.step_engine._full(param):
            return math.exp(float(param.detach().float().reshape(-1)[0]))

    def evaluate(self) -> dict:
        """Zero-shot and retrieval on rank 0 (all ranks gather the weights under ZeRO-3)."""
        import deepspeed.comm as dist

        from .eval import evaluate
        if self.eval_data is None:
            return {}
        model = self.step_engine.model
        gathered = nullcontext()
        if self.step_engine.engine.zero_optimization_stage() >= 3:
            import deepspeed
            gathered = deepspeed.zero.GatheredParameters(list(model.parameters()))
        results = {}
        with gathered:
            if self.rank == 0:
                model.eval()
                bf16 = next(model.parameters()).dtype == torch.bfloat16
                autocast = torch.autocast(self.device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
                with torch.no_grad(), autocast:
                    results = evaluate(model, self.eval_data, self.tokenizer, self.device)
                model.train()
        dist.barrier()
        return results

    def _progress_bar(self):
        """tqdm's bar on a terminal; in a log file (a cluster job, a pipe) plain progress lines
        instead (``_show``), which do not pile up carriage returns."""
        if self.rank != 0 or not self.recipe.logging.progress or not sys.stderr.isatty():
            return None
        from tqdm import tqdm
        return tqdm(total=self.recipe.schedule.steps, initial=self.step, desc="train", unit="step",
                    dynamic_ncols=True, file=sys.stderr)

    def _show(self, bar, row) -> None:
        if bar is None:
            steps = self.recipe.schedule.steps
            if self.rank == 0 and self.recipe.logging.progress and (
                    row["step"] % max(1, steps // 20) == 0 or row["step"] == steps):
                print(f"step {row['step']}/{steps}: loss {row['loss']:.4f}, {row['samples_per_s']:.0f} samples/s, "
                      f"peak {row['peak_mem_gib']:.1f} GiB, skipped {row['skipped']}", file=sys.stderr, flush=True)
            return
        bar.n = row["step"]
        bar.set_postfix(loss=f"{row['loss']:.4f}", samples_s=f"{row['samples_per_s']:.0f}",
                        mem=f"{row['peak_mem_gib']:.1f}GiB", skipped=row["skipped"], refresh=False)
        bar.refresh()


def use_expandable_segments() -> None:
    """torch's caching allocator with expandable segments, unless the user configured it:
    measured on an H200 it keeps 1-5 GiB less in reserve beside the same allocated peak
    (fragmentation between chunks of different sizes; docs/planner.md), which the planner's
    runtime reserve assumes. Read when CUDA first allocates, so before any device work."""
    import os
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def main(argv: Optional[List[str]] = None) -> int:
    use_expandable_segments()
    args = parse_args(argv)
    try:
        recipe = load_recipe(args.config, args.set)
    except RecipeError as err:
        print(f"infcl-ds train: {err}", file=sys.stderr)
        return 2
    from .data import DataError
    start = time.perf_counter()
    try:
        trainer = Trainer(recipe, resume=args.resume)
    except (RecipeError, DataError, FileNotFoundError) as err:
        print(f"infcl-ds train: {err}", file=sys.stderr)
        return 2
    trainer.run()
    if trainer.rank == 0:
        print(f"train time: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
