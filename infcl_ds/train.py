"""`infcl-ds train --config RECIPE.yaml [--set key=value ...] [--resume latest | --restart]`.

Also ``deepspeed [launcher flags] --module infcl_ds.train --config RECIPE.yaml``, ``mpirun``
and ``srun`` (see docs/multi-node.md). One optimizer step per global batch: the engine encodes
the local batch in chunks, computes the exact loss over all ranks with the ring, re-encodes
and steps (infcl_ds/engine/step.py). The run directory (recipe key ``output_dir``) holds the
resolved recipe, checkpoints, metrics.csv / eval.csv / TensorBoard and metrics.png, of one run:
a start without --resume into a directory that holds a run is refused, and --restart moves
that run to OUTPUT_DIR.old-<UTC time> first (training/preflight.py).

Exit status (docs/reliability.md): 0 done; 2 the run cannot go on as configured (recipe, data,
output directory, disk, checkpoint: one line on stderr naming it); 3 a collective failed or
timed out (a peer rank is stopped, wedged or dead: one line naming this rank and its step); 4
the deepspeed launcher that started the ranks went away (SIGINT/SIGTERM to it: every rank
stops within 30 s, after a checkpoint being written; training/launcher_watch.py).
"""
import argparse
import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import List, Optional

import numpy as np
import torch

from .config import Recipe, RecipeError, build_deepspeed_config, check_world, dump_recipe, load_recipe
from .training.safe_load import TRUST_FLAG, TRUST_HELP, CheckpointError


def parse_args(argv: Optional[List[str]]):
    parser = argparse.ArgumentParser(prog="infcl-ds train", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[2])
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


def resolve_auto_chunk(recipe: Recipe, world: int, device: torch.device, rank: int) -> Recipe:
    """The recipe with `batch.chunk: auto` replaced by the planner's choice for this GPU
    (plan.auto_chunk), the smallest over the ranks (GPUs of different sizes in one job); every
    rank plans the same recipe, so all raise alike before the collective."""
    import deepspeed.comm as dist

    from .plan.errors import PlanError
    from .plan.plan import AUTO_CHUNK_CPU, auto_chunk, recipe_with
    check_world(recipe, world)
    if device.type == "cuda":
        try:
            chunk = auto_chunk(recipe, world, torch.cuda.get_device_properties(device).total_memory,
                               max(1, torch.cuda.device_count()))
        except PlanError as err:
            raise RecipeError(f"recipe: {err}; set batch.chunk to a number") from err
    else:
        chunk = min(AUTO_CHUNK_CPU, recipe.local_batch(world))
    if world > 1:
        smallest = torch.tensor([chunk], device=device)  # NCCL takes CUDA tensors, gloo CPU ones
        dist.all_reduce(smallest, op=dist.ReduceOp.MIN)
        chunk = int(smallest.item())
    if rank == 0:
        print(f"batch.chunk=auto: {chunk} samples per chunk", file=sys.stderr, flush=True)
    return recipe_with(recipe, "batch", chunk=chunk)


def resolve_auto_keep(recipe: Recipe, world: int, device: torch.device) -> Recipe:
    """The recipe with `data.keep_decoded_gib: auto` replaced by the planner's choice for this GPU
    (plan.auto_keep_gib; AUTO_KEEP_CPU_GIB on CPU ranks). Ranks may differ: what a rank keeps
    changes how often it decodes, never its pixels."""
    from .plan.plan import AUTO_KEEP_CPU_GIB, auto_keep_gib, recipe_with
    if recipe.data.keep_decoded_gib != "auto":
        return recipe
    if device.type == "cuda":
        gib = auto_keep_gib(recipe, world, torch.cuda.get_device_properties(device).total_memory,
                            max(1, torch.cuda.device_count()))
    else:
        gib = AUTO_KEEP_CPU_GIB
    return recipe_with(recipe, "data", keep_decoded_gib=gib)


def resolve_decoder(recipe: Recipe, device: torch.device) -> Recipe:
    """data.decoder=nvjpeg and hybrid decode on the rank's GPU: refused on a CPU rank. The recipe
    with hybrid's `data.gpu_decode_share: auto` replaced by the planner's share
    (plan.hybrid_gpu_share: the measured rates of the GPU and of the decode processes)."""
    from .data import DataError
    from .plan.plan import recipe_with
    from .plan.timing import hybrid_gpu_share
    data = recipe.data
    if data.host_batch != "encoded" or data.decoder not in ("nvjpeg", "hybrid"):
        return recipe
    if device.type != "cuda":
        raise DataError(f"data.decoder={data.decoder} decodes on the GPU and this rank runs on {device.type}: "
                        "use data.decoder=pil")
    if data.decoder == "hybrid" and data.gpu_decode_share == "auto":
        return recipe_with(recipe, "data", gpu_decode_share=hybrid_gpu_share(data.decode_workers))
    return recipe


class Trainer:
    """Everything one rank needs for a run; ``run()`` does the steps."""

    def __init__(self, recipe: Recipe, resume: Optional[str] = None, trust_checkpoint: bool = False,
                 allow_recipe_change: bool = False, restart: bool = False, watch=None):
        import deepspeed.comm as dist

        from .data import build_eval_data, build_train_data
        from .data.check import check_paths
        from .engine import ContrastiveEngine
        from .engine.optim import clip_param_groups
        from .models import create_model, get_tokenizer, model_info
        from .training.distributed import collective_timeout_s, init_distributed
        from .training.preflight import check_free_disk, check_output_dir, checkpoint_bytes
        from .training.schedule import warmup_cosine

        from .training.launcher_watch import LauncherWatch
        self.recipe = recipe
        self.phase = "joining the job"  # what this rank is doing, for the one-line error of a failure
        self.watch = watch if watch is not None else LauncherWatch([])
        self.watch.where = lambda: self.phase
        self.trust_checkpoint = trust_checkpoint
        self.device = init_distributed(collective_timeout_s(recipe.distributed.timeout))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.phase = "checking the recipe, data paths, output directory and checkpoint"
        if recipe.batch.chunk == "auto":
            recipe = self.recipe = resolve_auto_chunk(recipe, self.world, self.device, self.rank)
        # Everything below up to the model is checked by every rank on the same inputs: all
        # raise alike, none is left waiting in a collective.
        check_world(recipe, self.world)
        check_paths(recipe.data)
        self.run_dir = check_output_dir(recipe.output_dir, self.rank)
        self.checkpoint_dir = self.run_dir / "checkpoints"
        resume = resume or recipe.checkpoint.resume
        if not resume:
            self._claim_run_dir(restart)
        self.resume_dir = self._resume_dir(resume, allow_recipe_change)
        ds_config = build_deepspeed_config(recipe, self.world)
        if self.resharding:
            from .training import reshard
            why = reshard.unsupported(ds_config)
            if why:
                saved = reshard.ranks(self.saved_world)
                raise CheckpointError(f"cannot resume {self.resume_dir.name}, written by {saved}, on "
                                      f"{reshard.ranks(self.world)}: {why}; resume it on {saved}")
            ds_config = reshard.universal_config(ds_config)
        self.phase = "building the model, engine and data"
        random.seed(recipe.model.seed)
        np.random.seed(recipe.model.seed)
        torch.manual_seed(recipe.model.seed)
        model = create_model(recipe.model.name, loss=recipe.model.loss)
        if recipe.model.grad_checkpointing:
            model.set_grad_checkpointing(True)
        check_free_disk(self.run_dir, checkpoint_bytes(sum(p.numel() for p in model.parameters()),
                                                       recipe.precision.dtype))
        self.info = model_info(model)
        self.tokenizer = get_tokenizer(recipe.model.name)
        opt = recipe.optimizer
        # Decay groups on the unwrapped model: under ZeRO-3 a parameter's shape is its shard's.
        optimizer = torch.optim.AdamW(clip_param_groups(model, opt.weight_decay), lr=opt.lr,
                                      betas=tuple(opt.betas), eps=opt.eps)
        schedule = warmup_cosine(optimizer, recipe.schedule.steps, recipe.schedule.warmup_steps,
                                 recipe.schedule.min_lr_ratio)
        self.step_engine = ContrastiveEngine.create(
            model.to(self.device), ds_config, recipe.batch.chunk,
            optimizer=optimizer, offload_features=recipe.batch.offload_features,
            grad_accum_fp32=recipe.precision.grad_accum_fp32, loss=recipe.model.loss, lr_scheduler=schedule,
            compile_backend="inductor" if recipe.compiles(self.device.type) else None)
        # Raises DataError (missing paths, fewer samples than one global batch) on every rank.
        # keep_decoded_gib: auto resolved for this rank's device only (the recipe keeps "auto").
        data_spec = resolve_decoder(resolve_auto_keep(recipe, self.world, self.device), self.device).data
        self.data = build_train_data(data_spec, rank=self.rank, world_size=self.world,
                                     local_batch=recipe.local_batch(self.world), seed=recipe.model.seed,
                                     image_size=self.info["image_size"], tokenizer=self.tokenizer,
                                     mean=self.info["mean"], std=self.info["std"], device=self.device)
        self.eval_data = None
        if recipe.data.eval:
            self.eval_data = build_eval_data(recipe.data.eval, image_size=self.info["image_size"],
                                             tokenizer=self.tokenizer, batch_size=recipe.eval.batch_size,
                                             mean=self.info["mean"], std=self.info["std"])
        self.step = 0
        if self.resume_dir is not None:
            self.phase = f"resuming from {self.resume_dir}"
            self._resume()
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "recipe.yaml").write_text(dump_recipe(recipe))
            (self.run_dir / "run.json").write_text(json.dumps(
                {"world_size": self.world, "device": str(self.device), "model": recipe.model.name,
                 "local_batch": recipe.local_batch(self.world), "steps_per_epoch": self.data.steps_per_epoch}, indent=1))

    # -- construction -------------------------------------------------------------------
    def _claim_run_dir(self, restart: bool) -> None:
        """A fresh start owns its directory. Without --restart every rank reads the same
        directory before any rank has written to it (nothing counted by held_run is written
        before the engine's collectives), so all refuse alike. With --restart rank 0 moves the
        old run aside and every rank waits on one all-reduce (the process group exists): no
        rank writes into the directory mid-move, and a failed move stops every rank."""
        import deepspeed.comm as dist

        from .training.preflight import StartupError, held_run, move_old_run
        if not restart:
            held = held_run(self.run_dir)
            if held is not None:
                raise StartupError(
                    f"output_dir {self.run_dir} already holds a run ({held}): pass --resume latest to continue it, "
                    f"or --restart to move it to {self.run_dir}.old-<UTC time> "
                    f"and start over")
            return
        moved, failure = None, None
        if self.rank == 0:
            try:
                moved = move_old_run(self.run_dir)
            except OSError as err:
                failure = err
        failed = torch.tensor([float(failure is not None)], device=self.device)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        if failed.item():
            why = f": {failure}" if failure is not None else " (see rank 0)"
            raise StartupError(f"--restart could not move the run in output_dir {self.run_dir} aside{why}")
        if moved is not None:
            print(f"infcl-ds train: --restart: moved the previous run of {self.run_dir} to {moved}",
                  file=sys.stderr, flush=True)

    def _resume_dir(self, tag: Optional[str], allow_recipe_change: bool) -> Optional[Path]:
        """The verified checkpoint to resume (None for a fresh run), read before any heavy
        set-up: its tag inside checkpoints/, its manifest, this rank's client state
        (weights-only) and its recipe, whose trajectory-changing keys must be unchanged."""
        self.saved_world, self.merged_client = self.world, None
        if not tag:
            return None
        from .training import checkpoint, reshard
        from .training.recipe_change import summary as change_summary
        from .training.recipe_change import trajectory_changes
        tag_dir = checkpoint.resolve_tag(self.checkpoint_dir, tag)
        self.saved_world = reshard.saved_world_size(tag_dir)
        if self.resharding:
            self.merged_client = reshard.merged_client(
                tag_dir, self.saved_world, self.rank,
                lambda path, rank: checkpoint.read_client(path, rank, self.trust_checkpoint))
        else:
            checkpoint.read_client(tag_dir, self.rank, self.trust_checkpoint)
        saved = tag_dir / checkpoint.RECIPE
        changes = trajectory_changes(saved.read_text(), dump_recipe(self.recipe), str(saved)) if saved.is_file() else []
        if changes and not allow_recipe_change:
            raise CheckpointError(f"resuming {tag_dir.name} with a recipe that changes the run's trajectory "
                                  f"({change_summary(changes)}): refused; pass --allow-recipe-change to resume anyway")
        if changes and self.rank == 0:
            print(f"infcl-ds train: resuming {tag_dir.name} with recipe changes (--allow-recipe-change): "
                  f"{change_summary(changes)}", file=sys.stderr, flush=True)
        return tag_dir

    @property
    def resharding(self) -> bool:
        """Resuming a checkpoint written by another number of ranks (training/reshard.py)."""
        return self.saved_world != self.world

    def _resume(self) -> None:
        from .training import checkpoint, reshard
        if self.resharding:
            client = self.merged_client
            reshard.load(self.step_engine.engine, self.resume_dir, client, self.saved_world, self.rank, self.device,
                         self.recipe.model.seed, self.trust_checkpoint)
        else:
            client = checkpoint.load(self.step_engine.engine, self.resume_dir, self.rank, self.trust_checkpoint)
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
        from .training import checkpoint, divergence
        from .training.launcher_watch import agreed_stop
        from .training.metrics import MetricsLogger, peak_memory_gib
        r = self.recipe
        logger = MetricsLogger(self.run_dir, self.rank == 0, r.logging.tensorboard, resume_step=self.step)
        bar = self._progress_bar()
        lap, batches = time.perf_counter(), self._batches()
        from .engine.compile import graphs_compiled
        engine = self.step_engine.engine
        results, start = {}, self.step
        while self.step < r.schedule.steps:
            self.phase = f"after step {self.step}"
            if agreed_stop(self.watch, self.device, self.world):  # the job's launcher is gone
                self.watch.exit(self.rank)
            self.phase = f"step {self.step + 1}"
            batch = next(batches)
            lr = engine.get_lr()[0]  # the rate this step uses (the scheduler moves on in step())
            try:
                loss = self.step_engine.train_step(batch)
            except ValueError as err:  # raised on every rank alike (the loss shares its input check)
                features = divergence.nonfinite_features(err)
                if features is None:
                    raise
                raise divergence.diverged(self.step + 1, features, self.checkpoint_dir) from None
            divergence.check_step(self.step + 1, loss, engine.get_global_grad_norm(), self.checkpoint_dir)
            # An encoded batch finds its undecodable images during the step (data/encoded.py).
            self.data.skipped += getattr(batch, "decode_skipped", 0)
            decode_wait = getattr(batch, "decode_wait_s", 0.0)
            host_bytes = batch.nbytes / len(batch)
            # Dropped before the next is asked for: the data thread fills the next batch while
            # this one trains, so a rank holds two local batches, not three.
            del batch
            self.step += 1
            now = time.perf_counter()
            seconds, lap = now - lap, now
            if self.step % r.logging.every == 0 or self.step == r.schedule.steps:
                row = {"step": self.step, "epoch": self.data.state_dict()["epoch"], "loss": loss.item(),
                       "lr": lr, "logit_scale": self._logit_scale(),
                       "samples_per_s": r.batch.global_size / seconds, "step_s": seconds,
                       "peak_mem_gib": peak_memory_gib(self.device), "skipped": self._skipped_total(),
                       "decode_wait_s": decode_wait, "host_bytes_per_sample": host_bytes,
                       # torch.compile's graphs so far (model.compile): flat after step 1, or
                       # something recompiles.
                       "graphs_compiled": graphs_compiled()}
                logger.log_step(row)
                self._show(bar, row)
            if r.eval.every and self.step % r.eval.every == 0 and self.step < r.schedule.steps:
                self.phase = f"evaluation at step {self.step}"
                logger.log_eval(self.step, self.evaluate())
            if r.checkpoint.every and self.step % r.checkpoint.every == 0 and self.step < r.schedule.steps:
                self._save(checkpoint)
        # Ends the data thread and workers now (the batch ahead is not needed), not at exit.
        batches.close()
        self.data.close()
        if self.step > start:  # else the tag it resumed from holds this state already
            self._save(checkpoint)
        if self.eval_data is not None:
            self.phase = "the final evaluation"
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
        from .training.divergence import check_weights
        self.phase = f"saving the checkpoint of step {self.step}"
        check_weights(self.step_engine.model.parameters(), self.step, self.checkpoint_dir, self.device, self.world)
        client = {"data": self.data.state_dict()}
        with self.watch.saving():  # a launcher that goes now waits for this save (it is atomic either way)
            checkpoint.save(self.step_engine.engine, self.checkpoint_dir, self.step, client, self.rank,
                            keep=self.recipe.checkpoint.keep, recipe_text=dump_recipe(self.recipe))

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
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


USER_ERROR_EXIT = 2


def _user_errors():
    """Errors that are the run's configuration or files, not a bug: one line, exit 2."""
    from .data import DataError
    from .training.divergence import DivergedError
    from .training.preflight import StartupError
    return RecipeError, DataError, CheckpointError, StartupError, DivergedError, FileNotFoundError


def _collective_failure(err: BaseException) -> bool:
    """A failed or timed-out collective (gloo, NCCL or the ring) rather than a bug here."""
    from .parallel.ring import RingError
    if isinstance(err, RingError) or type(err).__name__ in ("DistError", "DistBackendError", "DistNetworkError"):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and any(
        word in text for word in ("Timed out", "timed out", "Connection closed by peer", "Connection reset", "gloo"))


def _one_line(err: BaseException) -> str:
    """The error's own message on one line; for an error re-raised from a data-loader worker
    (whose message carries the worker's traceback) the original error's last line."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    if "Original Traceback" in str(err):
        last = lines[-1]
        return last.split(": ", 1)[1] if last.startswith(f"{type(err).__name__}: ") else last
    return " ".join(lines)


def _exit_now(code: int) -> None:
    """Leave at once: tearing the process group down would wait on the peer that failed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _report_collective_failure(err: BaseException, rank, phase: str, recipe: Recipe) -> None:
    """One line naming this rank, what it was doing and the failed operation; exit 3 at once."""
    from .training.distributed import TIMEOUT_EXIT_CODE, collective_timeout_s
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    print(f"infcl-ds train: rank {rank}, {phase}: a collective failed or timed out (timeout "
          f"{collective_timeout_s(recipe.distributed.timeout) / 60:g} min): a peer rank is stopped, wedged or "
          f"dead, see its log. {first}", file=sys.stderr)
    _exit_now(TIMEOUT_EXIT_CODE)


def main(argv: Optional[List[str]] = None) -> int:
    use_expandable_segments()
    args = parse_args(argv)
    from .training.distributed import make_timeout_env_importable
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
    start = time.perf_counter()
    trainer = None
    from .training.launcher_watch import watch_launcher
    watch = watch_launcher()  # from here on, a rank whose deepspeed launcher is killed stops
    try:
        trainer = Trainer(recipe, resume=args.resume, trust_checkpoint=args.trust_checkpoint,
                          allow_recipe_change=args.allow_recipe_change, restart=args.restart, watch=watch)
    except _user_errors() as err:  # found by every rank alike, before any work: a plain return
        print(f"infcl-ds train: {_one_line(err)}", file=sys.stderr)
        return USER_ERROR_EXIT
    except Exception as err:  # noqa: BLE001 - a peer that failed while the engine was built
        if not _collective_failure(err):
            raise
        _report_collective_failure(err, os.environ.get("RANK", "?"), "start-up", recipe)
    try:
        trainer.run()
    except _user_errors() + (OSError,) as err:  # OSError: a full disk or a vanished file system
        print(f"infcl-ds train: rank {trainer.rank}, {trainer.phase}: {_one_line(err)}", file=sys.stderr)
        _exit_now(USER_ERROR_EXIT)
    except Exception as err:  # noqa: BLE001 - collective failures become one line; the rest propagates
        if not _collective_failure(err):
            raise
        _report_collective_failure(err, trainer.rank, trainer.phase, recipe)
    if trainer.rank == 0:
        print(f"train time: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
