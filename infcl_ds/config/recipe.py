"""The training recipe: one YAML file, validated before any work.

A recipe is a tree of small dataclasses. Loading checks every key (an unknown key is an error
naming the nearest valid one), every type, and the batch arithmetic that would otherwise fail
deep inside a collective: the global batch must split evenly over the ranks, and a chunk must
fit in a local batch. Overrides come as ``section.key=value`` strings (``--set`` on the CLI),
their values parsed as YAML.
"""
import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import yaml


class RecipeError(ValueError):
    """A recipe that cannot run; the message names the key."""


@dataclass
class ModelSection:
    name: str = "infcl-tiny"                     # an open_clip architecture (ViT-B-16, ViT-L-14, infcl-tiny...)
    grad_checkpointing: bool = False             # activation checkpointing of both encoders
    seed: int = 0                                # initial weights and everything random


@dataclass
class DataSection:
    source: str = "synthetic"                    # webdataset | csv | synthetic
    train: Optional[Union[str, List[str]]] = None  # shards (brace pattern, directory, list) or a CSV/TSV
    eval: Optional[str] = None                   # a labelled split directory (see infcl-ds data digits)
    csv_img_key: str = "filepath"
    csv_caption_key: str = "title"
    csv_separator: Optional[str] = None          # default: tab for .tsv, comma otherwise
    synthetic_size: int = 4096
    workers: int = 2                             # data-loader processes per rank
    worker_batch: int = 256                      # samples per worker task (the pieces of a local batch)
    augment: bool = True


@dataclass
class BatchSection:
    global_size: int = 512                       # the contrastive batch across all ranks
    chunk: int = 64                              # samples encoded at once (activation memory)
    offload_features: bool = False               # cached features in pinned host memory


@dataclass
class OptimizerSection:
    lr: float = 5e-4
    weight_decay: float = 0.2                    # OpenCLIP's rule decides which parameters decay
    betas: List[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    grad_clip: float = 0.0                       # OpenCLIP clips nothing; DeepSpeed's default would be 1.0


@dataclass
class ScheduleSection:
    steps: int = 100                             # optimizer steps in the run
    warmup_steps: int = 10
    min_lr_ratio: float = 0.0                    # cosine floor as a fraction of lr


@dataclass
class PrecisionSection:
    dtype: str = "bf16"                          # bf16 | fp32
    grad_accum_fp32: bool = True                 # bf16 only: chunk gradients summed in fp32


@dataclass
class ZeroSection:
    stage: int = 2
    base_config: Optional[str] = None            # default: ds_configs/zero{stage}.json
    overrides: Dict[str, Any] = field(default_factory=dict)  # merged into the DeepSpeed config last


@dataclass
class CheckpointSection:
    every: int = 0                               # steps between checkpoints (0: only at the end)
    keep: int = 2                                # newest checkpoints kept
    resume: Optional[str] = None                 # "latest" or a tag


@dataclass
class LoggingSection:
    every: int = 1
    tensorboard: bool = True
    progress: bool = True


@dataclass
class EvalSection:
    every: int = 0                               # steps between evaluations (0: only at the end)
    batch_size: int = 256


# issue 16 (reliability): the collective timeout as a recipe key.
@dataclass
class DistributedSection:
    timeout: Optional[float] = None              # minutes a rank waits on a peer (any positive number);
                                                 # default: DEEPSPEED_TIMEOUT, else 30


@dataclass
class Recipe:
    output_dir: str = "runs/default"
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    batch: BatchSection = field(default_factory=BatchSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    precision: PrecisionSection = field(default_factory=PrecisionSection)
    zero: ZeroSection = field(default_factory=ZeroSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    eval: EvalSection = field(default_factory=EvalSection)
    distributed: DistributedSection = field(default_factory=DistributedSection)  # issue 16

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def local_batch(self, world_size: int) -> int:
        return self.batch.global_size // world_size


# YAML spells the global batch `global` (a Python keyword, hence the field's name).
_YAML_ALIASES = {"global": "global_size"}
_CHOICES = {("data", "source"): ("webdataset", "csv", "synthetic"), ("precision", "dtype"): ("bf16", "fp32"),
            ("zero", "stage"): (0, 1, 2, 3)}


def _field_names(cls) -> List[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _yaml_name(name: str) -> str:
    return {v: k for k, v in _YAML_ALIASES.items()}.get(name, name)


def _unknown_key(path: str, key: str, cls) -> RecipeError:
    valid = [_yaml_name(n) for n in _field_names(cls)]
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean {path + '.' if path else ''}{near[0]}?" if near else f"; valid keys: {', '.join(valid)}"
    return RecipeError(f"recipe: unknown key {path + '.' if path else ''}{key}{hint}")


def _check_type(path: str, value, annotation):
    """Accept ints for floats (YAML writes 1 for 1.0); reject everything else that does not match."""
    if value is None:
        return value
    kind = annotation if isinstance(annotation, type) else None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):  # YAML 1.1 reads 5e-4 as a string
        try:
            return float(value)
        except ValueError:
            pass
    if kind in (int, float, str, bool) and not (isinstance(value, kind) and not (kind is int and isinstance(value, bool))):
        raise RecipeError(f"recipe: {path} must be {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _build(cls, raw, path=""):
    if not isinstance(raw, dict):
        raise RecipeError(f"recipe: {path or 'the recipe'} must be a mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = {name: f.type for name, f in fields.items()}
    kwargs = {}
    for key, value in raw.items():
        name = _YAML_ALIASES.get(key, key)
        if name not in fields:
            raise _unknown_key(path, key, cls)
        sub = f"{path}.{key}" if path else key
        default = fields[name].default_factory() if fields[name].default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            kwargs[name] = _build(type(default), value or {}, sub)
        else:
            kwargs[name] = _check_type(sub, value, hints[name] if isinstance(hints[name], type) else None)
    return cls(**kwargs)


def _apply_override(tree: Dict[str, Any], assignment: str) -> None:
    if "=" not in assignment:
        raise RecipeError(f"--set {assignment!r}: expected section.key=value")
    dotted, text = assignment.split("=", 1)
    keys = dotted.strip().split(".")
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise RecipeError(f"--set {assignment!r}: {key} is not a section")
    node[keys[-1]] = yaml.safe_load(text)


# DeepSpeed keys the recipe sets itself (config/deepspeed_config.py): an override would
# silently change the step (e.g. gradient_accumulation_steps > 1 steps the optimizer less
# often, and the engine's gradient scaling assumes 1). The recipe key to use instead.
_OWNED_DEEPSPEED_KEYS = {
    "train_micro_batch_size_per_gpu": "batch.chunk", "gradient_accumulation_steps": "batch.global",
    "train_batch_size": "batch.global", "gradient_clipping": "optimizer.grad_clip",
    "bf16": "precision.dtype", "fp16": "precision.dtype", "scheduler": "schedule.*",
    "optimizer": "optimizer.*",
}


def _check_overrides(recipe: Recipe) -> None:
    overrides = recipe.zero.overrides
    for key, instead in _OWNED_DEEPSPEED_KEYS.items():
        if key in overrides:
            raise RecipeError(f"recipe: zero.overrides.{key} is set by the recipe; use {instead}")
    if "stage" in overrides.get("zero_optimization", {}):
        raise RecipeError("recipe: zero.overrides.zero_optimization.stage is set by the recipe; use zero.stage")
    accum = overrides.get("data_types", {}).get("grad_accum_dtype")
    if accum is not None and recipe.precision.dtype == "bf16":
        # DeepSpeed's own fp32 accumulation (BF16_Optimizer) cannot coalesce a step's chunks into
        # one reduction (NotImplementedError under ZeRO-1); the engine sums chunk gradients in fp32.
        raise RecipeError("recipe: zero.overrides.data_types.grad_accum_dtype is not supported with bf16; "
                          "precision.grad_accum_fp32 (default true) sums the chunk gradients in fp32")


def _validate(recipe: Recipe) -> None:
    _check_overrides(recipe)
    for (section, key), allowed in _CHOICES.items():
        value = getattr(getattr(recipe, section), key)
        if value not in allowed:
            raise RecipeError(f"recipe: {section}.{key} must be one of {list(allowed)}, got {value!r}")
    positive = {"batch.global": recipe.batch.global_size, "batch.chunk": recipe.batch.chunk,
                "schedule.steps": recipe.schedule.steps, "logging.every": recipe.logging.every,
                "data.worker_batch": recipe.data.worker_batch}
    for key, value in positive.items():
        if value < 1:
            raise RecipeError(f"recipe: {key} must be >= 1, got {value}")
    if recipe.data.workers < 0:
        raise RecipeError(f"recipe: data.workers must be >= 0, got {recipe.data.workers}")
    if not 0 <= recipe.schedule.warmup_steps <= recipe.schedule.steps:
        raise RecipeError(f"recipe: schedule.warmup_steps must be in [0, schedule.steps={recipe.schedule.steps}], "
                          f"got {recipe.schedule.warmup_steps}")
    if recipe.optimizer.lr <= 0 or recipe.optimizer.grad_clip < 0:
        raise RecipeError("recipe: optimizer.lr must be > 0 and optimizer.grad_clip >= 0")
    timeout = recipe.distributed.timeout  # issue 16: Optional[float], so not type-checked by _check_type
    if timeout is not None:
        try:
            minutes = float(timeout) if not isinstance(timeout, bool) else float("nan")
        except (TypeError, ValueError):
            minutes = float("nan")
        if not 0 < minutes < float("inf"):
            raise RecipeError(f"recipe: distributed.timeout must be a positive number of minutes, got {timeout!r}")
        recipe.distributed.timeout = minutes
    if recipe.data.source != "synthetic" and not recipe.data.train:
        raise RecipeError(f"recipe: data.train is required for data.source={recipe.data.source}")


def check_world(recipe: Recipe, world_size: int) -> None:
    """The batch arithmetic for a given number of ranks; raised on every rank before any collective."""
    b = recipe.batch
    if b.global_size % world_size:
        raise RecipeError(f"recipe: batch.global={b.global_size} is not divisible by the world size {world_size} "
                          f"(nearest valid: {b.global_size // world_size * world_size} or "
                          f"{(b.global_size // world_size + 1) * world_size})")
    local = b.global_size // world_size
    if b.chunk > local:
        raise RecipeError(f"recipe: batch.chunk={b.chunk} is larger than the local batch {local} "
                          f"(batch.global={b.global_size} over {world_size} ranks)")


def load_recipe(path: Optional[Union[str, Path]] = None, overrides: Optional[List[str]] = None) -> Recipe:
    """Read a YAML recipe (or start from the defaults), apply ``section.key=value`` overrides, validate."""
    tree: Dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise RecipeError(f"recipe: {path} does not exist")
        tree = yaml.safe_load(path.read_text()) or {}
    for assignment in overrides or []:
        _apply_override(tree, assignment)
    recipe = _build(Recipe, tree)
    _validate(recipe)
    return recipe


def dump_recipe(recipe: Recipe) -> str:
    """YAML that load_recipe reads back to the same recipe."""
    tree = recipe.to_dict()
    tree["batch"] = {_yaml_name(k): v for k, v in tree["batch"].items()}
    return yaml.safe_dump(tree, sort_keys=False)
