"""The training loop of one rank: `Trainer` builds everything a run needs (checks, run
directory, resume, engine, data) and `run()` does the steps, evaluations and checkpoints.
The command line and exit statuses are infcl_ds/train.py's and training/exits.py's."""
import json
import math
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import deepspeed
import deepspeed.comm as dist
import torch
from tqdm import tqdm

from ..checkpoint import reshard, store, tags
from ..checkpoint.safe_load import CheckpointError
from ..config import Recipe, build_deepspeed_config, check_world, dump_recipe
from ..config.deepspeed_config import base_keys_written_over
from ..data import build_eval_data, build_train_data
from ..data.commands.check import check_paths
from ..engine.compile import graphs_compiled
from ..eval import evaluate as evaluate_model
from ..eval import metric_label
from ..models import get_tokenizer, model_info
from ..run_dir import CHECKPOINTS, EVAL_JSON, RECIPE, RUN_INFO
from ..validation import NonFiniteFeaturesError
from . import divergence
from .build import build_engine
from .decode_split import SplitWatch
from .distributed import collective_timeout_s, init_distributed
from .heartbeat import StepHeartbeat
from .host_threads import limit_host_threads
from .launcher_watch import LauncherWatch, agreed_stop
from .metrics import GpuDecodeRate, MetricsLogger, PoolRate, peak_memory_gib
from .preflight import StartupError, check_free_disk, check_output_dir, checkpoint_bytes, held_run, move_old_run
from .recipe_change import summary as change_summary
from .recipe_change import decoder_change, trajectory_changes
from .resolve import agree_on_chunk, rank_sizes, resolve_recipe, saved_recipe
from .run_lock import RunLock, holds, share_refusal, take_if_owner


class Trainer:
    """Everything one rank needs for a run; ``run()`` does the steps."""

    def __init__(self, recipe: Recipe, resume: Optional[str] = None, trust_checkpoint: bool = False,
                 allow_recipe_change: bool = False, restart: bool = False, watch=None,
                 run_lock: Optional[RunLock] = None):
        self.recipe = recipe
        self.phase = "joining the job"  # what this rank is doing, for the one-line error of a failure
        self.watch = watch if watch is not None else LauncherWatch([])
        self.watch.where = lambda: self.phase
        self.trust_checkpoint = trust_checkpoint
        # Rank 0 locks the directory before joining (train.py may have done so already), and
        # tells every rank right after it, before any other collective: a directory that a
        # live run holds stops the whole job at once, each rank with the same line.
        self.run_lock = run_lock if run_lock is not None else take_if_owner(recipe.output_dir)
        self.device = init_distributed(collective_timeout_s(recipe.distributed.timeout))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # Every `auto`, from one plan for this rank; the same checks on every rank of a uniform
        # job: before any collective.
        resolution = resolve_recipe(recipe, self.world, self.device, self.rank)
        share_refusal(self.run_lock, self.rank, self.world, self.device)
        self.phase = "checking the recipe, data paths, output directory and checkpoint"
        resolution = agree_on_chunk(recipe, resolution, self.world, self.device, self.rank)
        limit_host_threads(resolution.recipe, self.world, self.device, rank_sizes(self.device).share, self.rank)
        recipe = self.recipe = saved_recipe(recipe, resolution)
        # Everything below up to the model is checked by every rank on the same inputs: all
        # raise alike, none is left waiting in a collective.
        check_world(recipe, self.world)
        check_paths(recipe.data)
        self.run_dir = check_output_dir(recipe.output_dir, self.rank)
        self.checkpoint_dir = self.run_dir / CHECKPOINTS
        resume = resume or recipe.checkpoint.resume
        if not resume:
            self._claim_run_dir(restart)
        self.resume_dir = self._resume_dir(resume, allow_recipe_change)
        ds_config = build_deepspeed_config(recipe, self.world)
        written_over = base_keys_written_over(recipe) if self.rank == 0 else None
        if written_over:
            print(f"infcl-ds train: {written_over}", file=sys.stderr, flush=True)
        if self.resharding:
            why = reshard.unsupported(ds_config)
            if why:
                saved = reshard.ranks(self.saved_world)
                raise CheckpointError(f"cannot resume {self.resume_dir.name}, written by {saved}, on "
                                      f"{reshard.ranks(self.world)}: {why}; resume it on {saved}")
            ds_config = reshard.universal_config(ds_config)
        self.phase = "building the model, engine and data"

        def check_disk(model):
            check_free_disk(self.run_dir, checkpoint_bytes(sum(p.numel() for p in model.parameters()),
                                                           recipe.precision.dtype))
        self.engine = build_engine(recipe, self.world, self.device, ds_config=ds_config, check_model=check_disk)
        self.info = model_info(self.engine.model)
        self.tokenizer = get_tokenizer(recipe.model.name)
        # Raises DataError (missing paths, fewer samples than one global batch) on every rank.
        # data's `auto` values as this rank resolved them (the saved recipe keeps "auto").
        self.data = build_train_data(resolution.recipe.data, rank=self.rank,
                                     world_size=self.world, local_batch=recipe.local_batch(self.world),
                                     seed=recipe.model.seed,
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
            (self.run_dir / RECIPE).write_text(dump_recipe(recipe))
            (self.run_dir / RUN_INFO).write_text(json.dumps(
                {"world_size": self.world, "device": str(self.device), "model": recipe.model.name,
                 "local_batch": recipe.local_batch(self.world), "steps_per_epoch": self.data.steps_per_epoch}, indent=1))

    # -- construction -------------------------------------------------------------------
    def _claim_run_dir(self, restart: bool) -> None:
        """A fresh start owns its directory. Without --restart every rank reads the same
        directory before any rank has written to it (nothing counted by held_run is written
        before the engine's collectives), so all refuse alike. With --restart rank 0 moves the
        old run aside and every rank waits on one all-reduce (the process group exists): no
        rank writes into the directory mid-move, and a failed move stops every rank."""
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
        tag_dir = tags.resolve_tag(self.checkpoint_dir, tag, owner=holds(self.checkpoint_dir.parent))
        self.saved_world = reshard.saved_world_size(tag_dir)
        if self.resharding:
            self.merged_client = reshard.merged_client(
                tag_dir, self.saved_world, self.rank,
                lambda path, rank: store.read_client(path, rank, self.trust_checkpoint))
        else:
            store.read_client(tag_dir, self.rank, self.trust_checkpoint)
        saved = tag_dir / RECIPE
        changes = trajectory_changes(saved.read_text(), dump_recipe(self.recipe), str(saved)) if saved.is_file() else []
        if changes and not allow_recipe_change:
            raise CheckpointError(f"resuming {tag_dir.name} with a recipe that changes the run's trajectory "
                                  f"({change_summary(changes)}): refused; pass --allow-recipe-change to resume anyway")
        if changes and self.rank == 0:
            print(f"infcl-ds train: resuming {tag_dir.name} with recipe changes (--allow-recipe-change): "
                  f"{change_summary(changes)}", file=sys.stderr, flush=True)
        switched = decoder_change(saved.read_text(), dump_recipe(self.recipe)) if saved.is_file() else None
        if switched and self.rank == 0:
            print(f"infcl-ds train: resuming {tag_dir.name} with data.decoder {switched}: the same rows, decoded "
                  "by another decoder (pixels within about half a level of the checkpoint's run); set data.decoder "
                  "to keep one", file=sys.stderr, flush=True)
        return tag_dir

    @property
    def resharding(self) -> bool:
        """Resuming a checkpoint written by another number of ranks (checkpoint/reshard.py)."""
        return self.saved_world != self.world

    def _resume(self) -> None:
        if self.resharding:
            client = self.merged_client
            reshard.load(self.engine.deepspeed, self.resume_dir, client, self.saved_world, self.rank, self.device,
                         self.recipe.model.seed, self.trust_checkpoint)
        else:
            client = store.load(self.engine.deepspeed, self.resume_dir, self.rank, self.trust_checkpoint)
        self.step = client["step"]
        self.data.load_state_dict(client["data"])

    # -- the loop -------------------------------------------------------------------------
    def _batches(self):
        """Local batches forever, epoch after epoch, from the data's saved position."""
        while True:
            yield from self.data
            self.data.set_epoch(self.data.state_dict()["epoch"] + 1)

    def _skipped_total(self) -> int:
        count = torch.tensor([float(self.data.skipped)], device=self.device)
        dist.all_reduce(count)
        return int(count.item())

    def run(self) -> dict:
        r = self.recipe
        logger = MetricsLogger(self.run_dir, self.rank == 0, r.logging.tensorboard, resume_step=self.step)
        bar = self._progress_bar()
        lap, batches = time.perf_counter(), self._batches()
        deepspeed_engine = self.engine.deepspeed
        results, start = {}, self.step
        pool, gpu_decode = PoolRate(self.data.decoder), GpuDecodeRate(self.data.decoder)
        # hybrid's split against this rank's own rates: moved (data.gpu_decode_share auto) or advised
        split_watch = SplitWatch(self.data.decoder, start, rebalance=r.data.gpu_decode_share == "auto",
                                 speaks=self.rank == 0)
        self.engine.phases.events = True  # each phase's time in metrics.csv, without synchronising
        # a line a minute on rank 0 while a step (with its wait for the batch) runs longer
        heartbeat = StepHeartbeat() if self.rank == 0 else None
        while self.step < r.schedule.steps:
            self.phase = f"after step {self.step}"
            if agreed_stop(self.watch, self.device, self.world):  # the job's launcher is gone
                self.watch.exit(self.rank)
            self.phase = f"step {self.step + 1}"
            waited = time.perf_counter()
            if heartbeat is not None:
                heartbeat.begin(self.step + 1, r.schedule.steps)
            batch = next(batches)  # assembled meanwhile by the data thread: a wait here is the readers'
            batch_wait = time.perf_counter() - waited
            lr = deepspeed_engine.get_lr()[0]  # the rate this step uses (the scheduler moves on in step())
            if heartbeat is not None:
                heartbeat.batch(batch)
            try:
                loss = self.engine.train_step(batch)
            except NonFiniteFeaturesError as err:  # raised on every rank alike (the loss shares its input check)
                raise divergence.diverged(self.step + 1, err.problem, self.checkpoint_dir) from None
            finally:
                if heartbeat is not None:
                    heartbeat.end()
            divergence.check_step(self.step + 1, loss, deepspeed_engine.get_global_grad_norm(), self.checkpoint_dir)
            # An encoded batch finds its undecodable images during the step (data/decoding/encoded.py).
            self.data.skipped += getattr(batch, "decode_skipped", 0)
            decode_wait = getattr(batch, "decode_wait_s", 0.0)
            batch_share = getattr(batch, "gpu_share", None)
            gpu_decode_wait = getattr(batch, "decode_wait_gpu_s", 0.0)
            host_bytes = batch.nbytes / len(batch)
            # Dropped before the next is asked for: the data thread fills the next batch while
            # this one trains, so a rank holds two local batches, not three.
            del batch
            self.step += 1
            now = time.perf_counter()
            seconds, lap = now - lap, now
            split_watch.step(self.step, batch_share, decode_wait, seconds, gpu_decode_wait)
            if self.step % r.logging.every == 0 or self.step == r.schedule.steps:
                row = {"step": self.step, "epoch": self.data.state_dict()["epoch"], "loss": loss.item(),
                       "lr": lr, "logit_scale": self._logit_scale(),
                       "samples_per_s": r.batch.global_size / seconds, "step_s": seconds,
                       "peak_mem_gib": peak_memory_gib(self.device), "skipped": self._skipped_total(),
                       **{f"{name}_s": seconds for name, seconds in self.engine.phases.times().items()},
                       "batch_wait_s": batch_wait, "decode_wait_s": decode_wait, "decode_wait_gpu_s": gpu_decode_wait,
                       "decode_rows_per_process_s": pool.since_last(),
                       "decode_busy_share": pool.busy_share, "decode_gpu_rows_per_s": gpu_decode.since_last(),
                       "decode_gpu_share": batch_share,
                       "host_bytes_per_sample": host_bytes,
                       # torch.compile's graphs so far (model.compile): flat after step 1, or
                       # something recompiles.
                       "graphs_compiled": graphs_compiled()}
                logger.log_step(row)
                self._show(bar, row)
            if r.eval.every and self.step % r.eval.every == 0 and self.step < r.schedule.steps:
                self.phase = f"evaluation at step {self.step}"
                logger.log_eval(self.step, self.evaluate())
                lap = time.perf_counter()  # the next step's time is its own, not the evaluation's
            if r.checkpoint.every and self.step % r.checkpoint.every == 0 and self.step < r.schedule.steps:
                self._save()
                lap = time.perf_counter()  # nor the save's
        # Ends the data thread and workers now (the batch ahead is not needed), not at exit.
        batches.close()
        if heartbeat is not None:
            heartbeat.close()
        self.data.close()
        if self.step > start:  # else the tag it resumed from holds this state already
            self._save()
        if self.eval_data is not None:
            self.phase = "the final evaluation"
            results = self.evaluate()
            logger.log_eval(self.step, results)
        if bar is not None:
            bar.close()
        plot = logger.close()
        if self.rank == 0:
            if results:
                (self.run_dir / EVAL_JSON).write_text(json.dumps(results, indent=1))
                for key, value in results.items():  # zero-shot top-1 last: the line people look for
                    if key != "zeroshot_top1":
                        print(f"{metric_label(key)}: {value:.4f}")
                print(f"{metric_label('zeroshot_top1')}: {results['zeroshot_top1']:.4f}")
            print(f"run directory: {self.run_dir}" + (f" (curves: {plot})" if plot else ""))
        if self.run_lock is not None:
            self.run_lock.release()  # the run is over: the directory may take the next one
        return results

    def _save(self) -> None:
        self.phase = f"saving the checkpoint of step {self.step}"
        divergence.check_weights(self.engine.model.parameters(), self.step, self.checkpoint_dir, self.device,
                                 self.world)
        client = {"data": self.data.state_dict()}
        with self.watch.saving():  # a launcher that goes now waits for this save (it is atomic either way)
            store.save(self.engine.deepspeed, self.checkpoint_dir, self.step, client, self.rank,
                       keep=self.recipe.checkpoint.keep, recipe_text=dump_recipe(self.recipe))

    def _logit_scale(self) -> float:
        param = self.engine.model.logit_scale
        with self.engine.full_parameter(param):
            return math.exp(float(param.detach().float().reshape(-1)[0]))

    def evaluate(self) -> dict:
        """Zero-shot and retrieval on rank 0 (all ranks gather the weights under ZeRO-3)."""
        if self.eval_data is None:
            return {}
        model = self.engine.model
        gathered = nullcontext()
        if self.engine.deepspeed.zero_optimization_stage() >= 3:
            gathered = deepspeed.zero.GatheredParameters(list(model.parameters()))
        results = {}
        with gathered:
            if self.rank == 0:
                model.eval()
                bf16 = next(model.parameters()).dtype == torch.bfloat16
                autocast = torch.autocast(self.device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
                with torch.no_grad(), autocast:
                    results = evaluate_model(model, self.eval_data, self.tokenizer, self.device)
                model.train()
        dist.barrier()
        return results

    def _progress_bar(self):
        """tqdm's bar on a terminal; in a log file (a cluster job, a pipe) plain progress lines
        instead (``_show``), which do not pile up carriage returns."""
        if self.rank != 0 or not self.recipe.logging.progress or not sys.stderr.isatty():
            return None
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
