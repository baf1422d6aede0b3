"""A recipe -> the DeepSpeed config, built on the JSON bases in ``infcl_ds/ds_configs/`` (package data).

How DeepSpeed's batch keys map onto ours (docs/training.md): the contrastive batch is
``batch.global`` across all ranks; each rank holds ``global / world`` samples (the local
batch) and encodes them ``batch.chunk`` at a time. The engine does the chunking itself and
reduces gradients once per step, so DeepSpeed sees ``train_micro_batch_size_per_gpu = chunk``,
``gradient_accumulation_steps = 1`` and ``train_batch_size = chunk * world``; those keys only
satisfy DeepSpeed's arithmetic check and its throughput timer, they do not size anything.
"""
import copy
import json
from pathlib import Path
from typing import Any, Dict

from ..resources import package_file
from .recipe import Recipe, RecipeError


def _merge(base: Dict[str, Any], extra: Dict[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def base_config(recipe: Recipe) -> Dict[str, Any]:
    if recipe.zero.base_config:
        path = Path(recipe.zero.base_config)
        if not path.is_file():
            raise RecipeError(f"recipe: zero.base_config {path} does not exist")
    else:
        path = package_file("ds_configs", f"zero{recipe.zero.stage}.json")
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        where = f" line {err.lineno}" if isinstance(err, json.JSONDecodeError) else ""
        raise RecipeError(f"recipe: zero.base_config {path}{where} is not a JSON DeepSpeed config") from None
    except RecursionError:  # json's decoder recurses per level of nesting
        raise RecipeError(f"recipe: zero.base_config {path} is nested too deeply to be a DeepSpeed config") from None
    if not isinstance(config, dict):
        raise RecipeError(f"recipe: zero.base_config {path} is not a JSON object")
    config.pop("_comment", None)
    zero = config.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else zero
    if stage != recipe.zero.stage:
        raise RecipeError(f"recipe: zero.stage={recipe.zero.stage} but {path} sets zero_optimization.stage={stage}")
    return config


def build_deepspeed_config(recipe: Recipe, world_size: int) -> Dict[str, Any]:
    """The full DeepSpeed config for this recipe on ``world_size`` ranks."""
    config = base_config(recipe)
    bf16 = recipe.precision.dtype == "bf16"
    ours = {
        "train_micro_batch_size_per_gpu": recipe.batch.chunk,
        "gradient_accumulation_steps": 1,
        "train_batch_size": recipe.batch.chunk * world_size,
        # Explicit: DeepSpeed 0.19.x would otherwise clip at 1.0, OpenCLIP clips nothing.
        "gradient_clipping": recipe.optimizer.grad_clip,
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,  # torch's AdamW (FusedAdam's JIT build fails on Hopper images)
        # No "scheduler": the trainer hands DeepSpeed its own (training/schedule.py), whose
        # first step has a nonzero rate; DeepSpeed's WarmupCosineLR starts at 0.
    }
    config = _merge(config, ours)
    if not bf16:
        config.pop("fp16", None)
    return _merge(config, recipe.zero.overrides)
