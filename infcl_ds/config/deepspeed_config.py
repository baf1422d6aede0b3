"""A recipe -> the DeepSpeed config, built on the JSON bases in ``infcl_ds/ds_configs/`` (package data).

How DeepSpeed's batch keys map onto ours (docs/training.md): the contrastive batch is
``batch.global`` across all ranks; each rank holds ``global / world`` samples (the local
batch) and encodes them ``batch.chunk`` at a time. The engine does the chunking itself and
reduces gradients once per step, so DeepSpeed sees ``train_micro_batch_size_per_gpu = chunk``,
``gradient_accumulation_steps = 1`` and ``train_batch_size = chunk * world``; those keys only
satisfy DeepSpeed's arithmetic check and its throughput timer, they do not size anything.

Two overrides, merged last: ``zero.overrides`` into the ``zero_optimization`` block (ZeRO's own
keys, DeepSpeedZeroConfig's), ``deepspeed.overrides`` into the whole config (any other key but
those the recipe sets).

A ``zero.base_config`` of one's own is most often a copy of a packaged base, so it may hold what
those hold and the recipe writes over (``WRITTEN_OVER_IN_BASE``): the recipe's value is used,
and the trainer names such keys once (``base_keys_written_over``).
"""
import copy
import difflib
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..resources import package_file
from ..shown import shown
from .recipe import Recipe, RecipeError, owned_key, recipe_key_of

# ZeRO's offloads that may go to NVMe, each into the directory of its nvme_path.
_OFFLOADS = ("offload_optimizer", "offload_param")
# The recipe's keys (owned_key) that the packaged bases hold, at what build_deepspeed_config
# writes over them. The recipe's other keys stay refused in a base: no packaged base holds them,
# and a base that does asks for what the recipe decides otherwise (an accumulation or a batch:
# batch.*; fp16: precision.dtype) or what DeepSpeed would drop (optimizer, scheduler).
WRITTEN_OVER_IN_BASE = ("gradient_clipping", "bf16")


def _merge(base: Dict[str, Any], extra: Dict[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_base(recipe: Recipe) -> Tuple[Path, Dict[str, Any]]:
    """The base config's path and JSON object, as written; RecipeError if it is not one."""
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
    return path, config


def base_config(recipe: Recipe) -> Dict[str, Any]:
    """The base config the recipe's keys are merged into: without the keys the recipe writes over
    (whole: bf16's other settings are not the recipe's), holding none of its other keys."""
    path, config = _read_base(recipe)
    for key in WRITTEN_OVER_IN_BASE:
        config.pop(key, None)
    owned = owned_key(config)
    if owned:
        raise RecipeError(f"recipe: zero.base_config {path}: {owned}")
    zero = config.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else zero
    if stage != recipe.zero.stage:
        raise RecipeError(f"recipe: zero.stage={recipe.zero.stage} but {path} sets zero_optimization.stage={stage}")
    return config


def base_keys_written_over(recipe: Recipe) -> Optional[str]:
    """One line naming the keys of the recipe's own zero.base_config that the recipe writes over,
    each with the recipe key and value used instead; None for a packaged base or one holding none."""
    if not recipe.zero.base_config:
        return None
    path, config = _read_base(recipe)
    held = [key for key in WRITTEN_OVER_IN_BASE if key in config]
    if not held:
        return None
    used = ", ".join(f"{recipe_key_of(key)}={_recipe_value(recipe, recipe_key_of(key))}" for key in held)
    are, values = ("is", "value") if len(held) == 1 else ("are", "values")
    return (f"zero.base_config {path}: {', '.join(held)} {are} set by the recipe; its {used} {are} used, "
            f"not the base config's {values}")


def _recipe_value(recipe: Recipe, dotted: str) -> Any:
    value = recipe
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _holds(config: Dict[str, Any], key: str) -> bool:
    for part in key.split("."):
        if not isinstance(config, dict) or part not in config:
            return False
        config = config[part]
    return True


def _written_at(recipe: Recipe, base: Dict[str, Any], key: str) -> str:
    """Where the ZeRO `key` (dotted, inside zero_optimization) is written, for a message:
    zero.overrides, else the base config, else (nowhere) zero.overrides, where it would go."""
    if _holds(base, f"zero_optimization.{key}") and not _holds(recipe.zero.overrides, key):
        base_name = recipe.zero.base_config or f"zero{recipe.zero.stage}.json"
        return f"zero.base_config {base_name}: zero_optimization.{key}"
    return f"zero.overrides.{key}"


def _zero_keys() -> List[str]:
    """The keys of DeepSpeed's zero_optimization block, as its DeepSpeedZeroConfig reads them."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    fields = DeepSpeedZeroConfig.model_fields
    return sorted({name for name in fields} | {field.alias for field in fields.values() if field.alias})


def _check_zero_overrides(recipe: Recipe) -> None:
    """zero.overrides holds only ZeRO's keys: DeepSpeed refuses any other inside zero_optimization,
    with a traceback half-way through its start-up. A key of the whole config (bf16,
    wall_clock_breakdown) is named with the section that takes it."""
    if not recipe.zero.overrides:
        return  # no DeepSpeed import for a recipe without ZeRO overrides
    known = _zero_keys()
    for key in recipe.zero.overrides:
        if key in known:
            continue
        if key == "zero_optimization":
            raise RecipeError("recipe: zero.overrides.zero_optimization: zero.overrides is merged into "
                              "zero_optimization already; write its keys directly under zero.overrides")
        what = f"recipe: zero.overrides.{key} is not a ZeRO key (zero.overrides is merged into zero_optimization only"
        owned = owned_key({key: None})
        if owned:  # deepspeed.overrides would refuse it too: the recipe key to use
            raise RecipeError(f"{what}; the whole config's keys go in deepspeed.overrides), and {owned}")
        near = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
        hint = (f"did you mean zero.overrides.{near[0]}?" if near else
                f"a key of the whole DeepSpeed config goes in deepspeed.overrides.{key}")
        raise RecipeError(f"{what}); {hint}")


def _check_nvme_paths(recipe: Recipe, base: Dict[str, Any]) -> None:
    """Each ZeRO offload to NVMe names an existing directory (on the node that loads the recipe):
    DeepSpeed would fail on it half-way through its start-up, with a traceback."""
    zero = base.get("zero_optimization", {})
    zero = _merge(zero, recipe.zero.overrides) if isinstance(zero, dict) else recipe.zero.overrides
    for name in _OFFLOADS:
        offload = zero.get(name)
        if offload is None:
            continue
        if not isinstance(offload, dict):
            raise RecipeError(f"recipe: {_written_at(recipe, base, name)} must be a mapping, got {shown(offload)}")
        if offload.get("device") != "nvme":
            continue
        path, where = offload.get("nvme_path"), _written_at(recipe, base, f"{name}.nvme_path")
        if not isinstance(path, str) or not path:
            raise RecipeError(f"recipe: {where} must be a directory for device nvme, got {shown(path)}")
        if not Path(path).is_dir():
            why = "is not a directory" if Path(path).exists() else "does not exist"
            raise RecipeError(f"recipe: {where} {shown(path, quote=False)} {why}")


def check_deepspeed_config(recipe: Recipe) -> None:
    """What the recipe's DeepSpeed settings can be checked for at load: zero.overrides' keys, the
    base config (a JSON object of the recipe's ZeRO stage, holding none of the recipe's keys) and
    the NVMe offload directories; RecipeError naming the key otherwise."""
    _check_zero_overrides(recipe)
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
    config = _merge(config, recipe.deepspeed.overrides)
    return _merge(config, {"zero_optimization": recipe.zero.overrides}) if recipe.zero.overrides else config
