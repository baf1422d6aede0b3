"""Resuming a checkpoint on another number of ranks than the one that wrote it.

What in a tag depends on the number of ranks, and how each part is carried over:

- ZeRO 1-3 partition the fp32 master weights and Adam moments over the writing ranks
  (``*zero_pp_rank_<r>_*optim_states.pt``), and DeepSpeed loads those files only on as many
  ranks. Rank 0 converts the tag to DeepSpeed's universal checkpoint format (one fp32 weight,
  ``exp_avg`` and ``exp_avg_sq`` per parameter: ``deepspeed.checkpoint.ds_to_universal``) in
  a scratch directory beside the tags, every file read weights-only; the engine, built with
  ``checkpoint: {load_universal: true}``, cuts its own partitions out of it
  (``after_universal_load`` completes what DeepSpeed's loader leaves undone), and the scratch
  is removed once every rank has loaded. The learning-rate schedule and DeepSpeed's
  step count come from the model-states file as on a same-size resume.
- ZeRO 0 keeps the whole model and its optimizer in ``mp_rank_00_model_states.pt``: it loads
  as it is.
- The data position is a number of global batches into an epoch, the same on every rank; with
  the same ``batch.global`` (a trajectory key, so a resume keeps it) the sampler cuts the same
  global batches from the same permutation, so the global sample order continues exactly;
  only which rank takes which rows of a batch changes (data/sources/sampler.py). The writing ranks'
  counts of replaced samples go, summed, to the new rank 0, so the logged total continues.
- RNG streams are per rank, and a new rank has none of its own: on every rank Python's,
  numpy's and torch's streams are seeded from (model.seed, step, rank). Reproducible, though
  not the streams the old ranks would have drawn; sampling and augmentation do not draw from
  them (they are functions of seed, epoch and sample index), only randomness inside the model
  (dropout) does.
"""
import contextlib
import io
import re
import shutil
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch

from .manifest import read_manifest
from .safe_load import CheckpointError, deepspeed_reads_weights_only

_CLIENT = re.compile(r"client_rank(\d+)\.pt")


def ranks(n: int) -> str:
    return f"{n} rank{'s' * (n != 1)}"
# Beside the tags (a name no tag glob matches): the universal form of the tag being resumed.
SCRATCH = ".universal"


def saved_world_size(tag_dir: Path) -> int:
    """The number of ranks that wrote a verified tag: one client state file per rank."""
    ranks = sorted(int(m.group(1)) for name in read_manifest(tag_dir)["files"] if (m := _CLIENT.fullmatch(name)))
    if not ranks or ranks != list(range(len(ranks))):
        raise CheckpointError(f"checkpoint {tag_dir} holds the client states of ranks {ranks}: "
                              "not those of ranks 0 to N-1 of one run")
    return len(ranks)


def unsupported(ds_config: Dict[str, Any]) -> Optional[str]:
    """Why this engine cannot take re-partitioned states (None if it can). Decided from the
    config alone, so that every rank refuses alike before any collective."""
    zero = ds_config.get("zero_optimization", {}) or {}
    for key in ("offload_optimizer", "offload_param"):
        if isinstance(zero.get(key), dict) and zero[key].get("device") == "nvme":
            return (f"zero_optimization.{key} on NVMe: DeepSpeed restores swapped optimizer states only on the "
                    "number of ranks that wrote them")
    return None


def universal_config(ds_config: Dict[str, Any]) -> Dict[str, Any]:
    """The DeepSpeed config of an engine that loads a universal checkpoint (ZeRO 1-3)."""
    stage = (ds_config.get("zero_optimization", {}) or {}).get("stage", 0)
    if stage == 0:
        return ds_config
    return {**ds_config, "checkpoint": {**ds_config.get("checkpoint", {}), "load_universal": True}}


def derived_rng_state(seed: int, step: int, rank: int) -> None:
    """Seed this rank's Python, numpy and torch streams from (seed, step, rank)."""
    import random
    words = np.random.SeedSequence([seed, step, rank]).generate_state(2)
    random.seed(int(words[0]))
    np.random.seed(int(words[0]))
    torch.manual_seed(int(words[0]) << 32 | int(words[1]))


def merged_client(tag_dir: Path, saved_world: int, rank: int, read_client) -> Dict[str, Any]:
    """This new rank's client state from the writing ranks': the data position they share,
    their replaced-sample counts summed on rank 0."""
    clients = [read_client(tag_dir, r) for r in range(saved_world)]
    positions = {(c["data"]["epoch"], c["data"]["step"], c["step"]) for c in clients}
    if len(positions) != 1:
        raise CheckpointError(f"checkpoint {tag_dir}: its ranks saved different positions {sorted(positions)}")
    data = dict(clients[0]["data"])
    data["skipped"] = sum(c["data"]["skipped"] for c in clients) if rank == 0 else 0
    return {"step": clients[0]["step"], "data": data}


def to_universal(tag_dir: Path, out_dir: Path, trust: bool = False) -> None:
    """Write the universal form of a ZeRO 1-3 tag to ``out_dir`` (replaced if there)."""
    from deepspeed.checkpoint import ds_to_universal
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    args = Namespace(input_folder=str(tag_dir), output_folder=str(out_dir), num_extract_workers=1,
                     num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
    # One process (its worker pools would not inherit the weights-only reader); its progress
    # chatter and bars are dropped.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            deepspeed_reads_weights_only(trust):
        ds_to_universal.main(args)


def convert_on_rank0(tag_dir: Path, rank: int, device, trust: bool = False) -> Path:
    """Rank 0 writes the universal form of ``tag_dir``; every rank returns its directory, or
    raises CheckpointError alike if the conversion failed."""
    import deepspeed.comm as dist
    out_dir = tag_dir.parent / SCRATCH / tag_dir.name
    failure = None
    if rank == 0:
        try:
            to_universal(tag_dir, out_dir, trust)
        except CheckpointError as err:
            failure = str(err)
        except Exception as err:  # noqa: BLE001 - DeepSpeed's converter raises what it likes; one line for all
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            failure = f"{type(err).__name__}: {first}"
    failed = torch.tensor([float(failure is not None)], device=device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failed.item():
        raise CheckpointError(f"checkpoint {tag_dir} could not be re-partitioned for {ranks(dist.get_world_size())}"
                              f"{': ' + failure if failure else ' (see rank 0)'}")
    return out_dir


def after_universal_load(engine, universal_dir: Path, trust: bool = False) -> None:
    """What DeepSpeed 0.19's universal loader leaves undone (every rank calls this):

    - each optimizer group gets its own saved settings (weight decay, betas, eps, rate): the
      ZeRO-3 loader copies the first group's onto every group, which would decay the no-decay
      group (biases, norms, the logit scale);
    - each group's Adam state gets its own step counter: the ZeRO-3 loader gives every group
      the same tensor, which torch's AdamW advances in place once per group, so every group but
      the first would step with a wrong bias correction."""
    from .safe_load import load_weights_only
    path = Path(universal_dir) / "zero" / "optimizer_state.pt"
    saved = torch.load(path, map_location="cpu", weights_only=False) if trust else load_weights_only(path)
    groups = engine.optimizer.optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        raise CheckpointError(f"checkpoint {path} holds {len(saved['param_groups'])} optimizer groups, this engine "
                              f"{len(groups)}: written for another optimizer grouping")
    for group, saved_group in zip(groups, saved["param_groups"]):
        group.update({key: value for key, value in saved_group.items() if key != "params"})
    for state in engine.optimizer.optimizer.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"] = state["step"].clone()


def remove_scratch(universal_dir: Path) -> None:
    """Once every rank has loaded (rank 0, after a collective): the copy is not needed again."""
    shutil.rmtree(Path(universal_dir).parent, ignore_errors=True)


def announce(tag: str, saved_world: int, world: int, stage: int, data: Dict[str, Any]) -> None:
    how = "re-partitioned through DeepSpeed's universal checkpoint" if stage else "loaded whole (ZeRO 0)"
    print(f"infcl-ds train: resuming {tag} written by {ranks(saved_world)} on {ranks(world)}: ZeRO-{stage} states "
          f"{how}; data continues at epoch {data['epoch']} "
          f"step {data['step']}; RNG streams re-derived per rank", file=sys.stderr, flush=True)


# What DeepSpeed's universal loader raises for files it cannot use (a collective that failed,
# a RuntimeError, is left to the trainer's own handling).
_LOAD_ERRORS = (CheckpointError, AssertionError, ValueError, KeyError, TypeError, IndexError, OSError)


def load(engine, tag_dir: Path, client: Dict[str, Any], saved_world: int, rank: int, device, seed: int,
         trust: bool = False) -> None:
    """Restore the engine from a tag written by ``saved_world`` ranks onto this job's ranks,
    and derive this rank's RNG streams; every rank calls it, and a failure on any rank raises
    CheckpointError on all."""
    import deepspeed.comm as dist

    from .store import load_engine
    world, stage = dist.get_world_size(), engine.zero_optimization_stage()
    if rank == 0:
        announce(tag_dir.name, saved_world, world, stage, client["data"])
    source = convert_on_rank0(tag_dir, rank, device, trust) if stage > 0 else tag_dir
    failure = None
    try:
        load_engine(engine, tag_dir, trust, source)
        if stage > 0:
            after_universal_load(engine, source, trust)
    except _LOAD_ERRORS as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        failure = err if isinstance(err, CheckpointError) else CheckpointError(
            f"checkpoint {tag_dir} could not be loaded on {ranks(world)}: {type(err).__name__}: {first}")
    failed = torch.tensor([float(failure is not None)], device=device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if stage > 0 and rank == 0:
        remove_scratch(source)
    if failure is not None:
        raise failure
    if failed.item():
        raise CheckpointError(f"checkpoint {tag_dir} could not be loaded on {ranks(world)} (see the other ranks)")
    derived_rng_state(seed, client["step"], rank)
