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
from ..shown import shown
from .recipe import Recipe, RecipeError, owned_key

# ZeRO's offloads that may go to NVMe, each into the directory of its nvme_path.
_OFFLOADS = ("offload_optimizer", "offload_param")


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
    # The packaged bases hold gradient_clipping and bf16 at what build_deepspeed_config writes
    # over them; a base of one's own holds only what the recipe leaves to DeepSpeed.
    owned = owned_key(config) if recipe.zero.base_config else None
    if owned:
        raise RecipeError(f"recipe: zero.base_config {path}: {owned}")
    zero = config.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else zero
    if stage != recipe.zero.stage:
        raise RecipeError(f"recipe: zero.stage={recipe.zero.stage} but {path} sets zero_optimization.stage={stage}")
    return config


def _holds(config: Dict[str, Any], key: str) -> bool:
    for part in key.split("."):
        if not isinstance(config, dict) or part not in config:
            return False
        config = config[part]
    return True


def _written_at(recipe: Recipe, base: Dict[str, Any], key: str) -> str:
    """Where the DeepSpeed `key` (dotted) is written, for a message: zero.overrides, else the
    base config, else (nowhere) zero.overrides, where it would go."""
    if _holds(base, key) and not _holds(recipe.zero.overrides, key):
        return f"zero.base_config {recipe.zero.base_config or f'zero{recipe.zero.stage}.json'}: {key}"
    return f"zero.overrides.{key}"


def _check_nvme_paths(recipe: Recipe, base: Dict[str, Any]) -> None:
    """Each ZeRO offload to NVMe names an existing directory (on the node that loads the recipe):
    DeepSpeed would fail on it half-way through its start-up, with a traceback."""
    zero = _merge(base, recipe.zero.overrides).get("zero_optimization", {})
    for name in _OFFLOADS:
        offload = zero.get(name) if isinstance(zero, dict) else None
        if offload is None:
            continue
        if not isinstance(offload, dict):
            raise RecipeError(f"recipe: {_written_at(recipe, base, f'zero_optimization.{name}')} must be a "
                              f"mapping, got {shown(offload)}")
        if offload.get("device") != "nvme":
            continue
        path, where = offload.get("nvme_path"), _written_at(recipe, base, f"zero_optimization.{name}.nvme_path")
        if not isinstance(path, str) or not path:
            raise RecipeError(f"recipe: {where} must be a directory for device nvme, got {shown(path)}")
        if not Path(path).is_dir():
            why = "is not a directory" if Path(path).exists() else "does not exist"
            raise RecipeError(f"recipe: {where} {shown(path, quote=False)} {why}")


def check_deepspeed_config(recipe: Recipe) -> None:
    """What the recipe's DeepSpeed settings can be checked for at load: the base config (a JSON
    object of the recipe's ZeRO stage, holding none of the recipe's keys) and the NVMe offload
    directories; RecipeError naming the key otherwise."""
    _check_nvme_paths(recipe, base_config(recipe))


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
