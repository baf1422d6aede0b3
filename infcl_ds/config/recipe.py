"""The training recipe: one YAML file, validated before any work.

A recipe is a tree of small pydantic models, one per section (DeepSpeed builds its own config
the same way). Every default and every check lives here: unknown keys are errors naming the
nearest valid one, values have types, choices and bounds, and the checks across keys (the batch
arithmetic, a synthetic source large enough for one global batch, the DeepSpeed overrides) run
at load. Overrides come as ``section.key=value`` strings (``--set`` on the CLI), their values
parsed as YAML; the file and the values under the same rules (recipe_yaml.py: no duplicate
keys, aliases or deep nesting, keys are names). Every problem is a one-line RecipeError naming
the key, or the file and line.
"""
import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Dict, List, Literal, Optional, Tuple, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError, field_validator, \
    model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from ..shown import shown
from . import recipe_yaml


class RecipeError(ValueError):
    """A recipe that cannot run; the message names the key."""


# Upper bounds of sizes and counts, checked at load: what one machine, or the run's own
# bookkeeping, can hold. Optimizer values are bounded by being finite: a value that diverges is
# the divergence guard's to report (training/divergence.py names the step).
# Samples (batch sizes, a synthetic source): ~90x the 12M-sample batches this project targets;
# sample indices and counts stay far inside int32 and int64 arithmetic.
MAX_SAMPLES = 2 ** 30
# Processes a rank forks (data.workers, data.decode_workers): more than the hardware threads of
# the largest nodes (2 x 192 cores with SMT: 768), and every rank of the node forks its own.
MAX_PROCESSES = 1024
MAX_GPU_DECODE_LANES = 16  # threads: more than the host has cores to drive
# GiB of one rank's host or GPU memory (data.*_gib): 16 TiB, more than any node holds.
MAX_GIB = 16384
# Steps: checkpoint tags are step_%08d, ordered by name (training/checkpoint.py).
MAX_STEPS = 10 ** 8 - 1
# An eval batch is decoded whole in host memory: 65,536 images of 224 px are 39 GB in float32.
MAX_EVAL_BATCH = 2 ** 16
# data.image_bytes is a mean stored image size: at most the largest image file a source reads
# (data/sources/samples.py MAX_IMAGE_BYTES, which the tests hold equal to this).
MAX_IMAGE_BYTES = 64 << 20

# A number YAML 1.2 reads that PyYAML's YAML 1.1 leaves as text (it wants a dot and a signed
# exponent): 1e-3, 5E4, 1.0e3.
_DECIMAL = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def as_number(value) -> Optional[float]:
    """`value` as a recipe's number, or None if it is not one: an int or a float, or a decimal
    written as text (see _DECIMAL), never a bool. YAML reads yes/no/on/off/true/false as
    booleans, and Python's bool is an int, so `lr: yes` would otherwise be 1.0."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return float(value) if _DECIMAL.fullmatch(value) else None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an int beyond a float's range: infinite, for the finite check
            return float("inf")
    return None


def _number(value):
    number = as_number(value)
    if number is None:
        raise PydanticCustomError("float_type", "Input should be a valid number")
    return number


def Count(low: int, high: int):
    """An int from `low` to `high`. YAML gives ints for ints: a bool or a float is not silently one."""
    return Annotated[int, Strict(), Field(ge=low, le=high)]


# A number: a float or an int (`lr: 1`), never a bool (as_number).
Float = Annotated[float, Strict(), BeforeValidator(_number)]
NonNegativeFloat = Annotated[Float, Field(ge=0)]
Fraction = Annotated[Float, Field(ge=0, le=1)]
Text = Annotated[str, Field(min_length=1)]


class Section(BaseModel):
    # Unknown keys are errors; NaN and infinities are not numbers here.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


def compile_supported(zero_stage: int) -> bool:
    """Whether the towers can be compiled (model.compile, engine/compile.py) under ZeRO
    ``zero_stage``: stages 0-2. ZeRO-3 gathers each module's parameters in hooks around its
    forward and backward, and those hooks break the compiled graphs. Stated here, with the
    recipe, so that the recipe's checks, the engine and the planner ask one place."""
    return zero_stage < 3


def compile_stage_refusal(zero_stage: int) -> Optional[str]:
    """Why model.compile cannot run under ZeRO `zero_stage` (compile_supported), one line naming
    both keys, or None: the recipe's check and the engine's word it alike."""
    if compile_supported(zero_stage):
        return None
    return (f"model.compile is not supported with zero.stage={zero_stage} (its per-module parameter gathering "
            f"breaks compiled graphs): use zero.stage 0-2 or model.compile: false")


def float8_supported(zero_stage: int) -> bool:
    """Whether the towers' float8 linear layers (model.float8, engine/float8.py) run under ZeRO
    ``zero_stage``: 0-2. Under ZeRO-3 they are untested (its per-module gathering around
    torchao's Float8Linear), so refused rather than assumed."""
    return zero_stage < 3


def float8_stage_refusal(setting, zero_stage: int) -> Optional[str]:
    """Why `model.float8: setting` cannot run under ZeRO `zero_stage` (float8_supported), one line
    naming both keys, or None: the recipe's check and the engine's word it alike."""
    if not setting or float8_supported(zero_stage):
        return None
    return (f"model.float8={setting} is not supported with zero.stage={zero_stage} (float8 linear layers "
            f"under ZeRO-3's parameter gathering are untested): use zero.stage 0-2 or model.float8: false")


class ModelSection(Section):
    name: Text = "infcl-tiny"                    # an open_clip architecture (ViT-B-16, ViT-L-14, infcl-tiny...)
    grad_checkpointing: bool = False             # activation checkpointing of both encoders
    # initial weights and everything random; numpy's and Python's seeds take 32 bits
    seed: Count(0, 2 ** 32 - 1) = 0
    loss: Literal["clip", "siglip"] = "clip"     # clip (softmax) | siglip (sigmoid; the model gets a logit_bias)
    # torch.compile of both towers (engine/compile.py), once per chunk shape and pass. auto: on
    # for CUDA ranks where the ZeRO stage allows it (compile_supported: 0-2),
    # off on CPU ranks (inductor needs a C++ compiler and gains little).
    compile: Union[Literal["auto"], bool] = "auto"
    # The towers' linear layers in float8 with torchao's rowwise scales (engine/float8.py): opt-in,
    # not bf16's numerics; CUDA GPUs of compute capability 8.9+ (H100, H200); ZeRO 0-2. emulate:
    # the same rounding through torchao's emulation on any device (slow; for checking numerics).
    float8: Union[bool, Literal["emulate"]] = False
    # The encode pass (no grad) takes each MLP's first bias and GELU into cuBLASLt's GEMM epilogue
    # (engine/towers.py, EpilogueGeluMlp): tanh GELU there, within bf16's rounding of open_clip's
    # erf GELU; the re-encode with grad keeps the erf. false: open_clip's MLP on every pass.
    gelu_epilogue: bool = True


SYNTHETIC_SIZE = 4096
# Characters that cannot separate a CSV's fields: the quote, line breaks, NUL.
_NOT_SEPARATORS = '"\r\n\0'
_NOT_SEPARATORS_TEXT = "'\"', a line break or NUL"


class DataSection(Section):
    source: Literal["webdataset", "csv", "synthetic"] = "synthetic"
    train: Optional[Union[Text, List[Text]]] = None  # shards (brace pattern, directory, list) or a CSV/TSV
    eval: Optional[Text] = None                  # a labelled split directory (see infcl-ds data digits)
    csv_img_key: Text = "filepath"
    csv_caption_key: Text = "title"
    csv_separator: Optional[str] = None          # one character; default: tab for .tsv, comma otherwise
    synthetic_size: Optional[Count(1, MAX_SAMPLES)] = None  # default: SYNTHETIC_SIZE, or one global batch if larger
    workers: Count(0, MAX_PROCESSES) = 2         # data-loader processes per rank
    worker_batch: Count(1, MAX_SAMPLES) = 256    # samples per worker task (the pieces of a local batch)
    augment: bool = True
    host_batch: Literal["encoded", "decoded"] = "encoded"  # encoded: images held as stored, decoded per chunk
    # encoded: decode processes per rank (0: decode in the training process). auto: the cores of
    # this rank's share of the node less those its other work keeps busy, resolved per rank at
    # start-up (plan/auto_values.py).
    decode_workers: Union[Literal["auto"], Count(0, MAX_PROCESSES)] = "auto"
    # encoded: pil is open_clip's pipeline, pixel for pixel; torchvision (torchvision.io's
    # libjpeg-turbo, torch's resize) in the same processes, pixels close to PIL's; nvjpeg decodes
    # on the rank's GPU (no decode processes); hybrid splits each chunk between the PIL processes
    # and the GPU (data/decoding/encoded.py ChunkDecoder, data/decoding/device_decode.py;
    # docs/training.md). auto: resolved per rank at start-up from the measured decode rates
    # (infcl_ds/calibration/decode_rates.json, docs/benchmarks/decode.json): pil where the rank's
    # decode processes keep up with its planned step (and on a CPU rank, and for shards that are
    # not JPEG), else the GPU decoder alone (nvjpeg), or hybrid where the processes beside it
    # shorten the step (plan/auto_values.py).
    decoder: Literal["auto", "pil", "torchvision", "nvjpeg", "hybrid"] = "auto"
    # encoded, nvjpeg and hybrid: the library that drives the GPU's JPEG decoding. torchvision:
    # its nvJPEG binding; nvimgcodec: NVIDIA's nvImageCodec (the gpu-decode extra), whose batched
    # call reaches the GPU's hardware JPEG decoder (data/decoding/nvimgcodec_decode.py). Both
    # decode 3,000-3,400 photos/s beside a training tower on an H200, and only torchvision's
    # calls overlap in lanes (docs/benchmarks/decode.json, decode_variants.json), so it stays
    # the default.
    gpu_jpeg_library: Literal["torchvision", "nvimgcodec"] = "torchvision"
    # encoded, nvjpeg and hybrid: threads decoding on the GPU, each with a CUDA stream (and an
    # nvImageCodec decoder) of its own. Beside training a library call waits on the busy GPU and
    # several calls overlap: with torchvision 4 lanes decoded 2.5x one lane's 30 KB photos/s
    # (1.2x for ~85 KB ones) and slowed the towers more, each lane a core busy; nvImageCodec's
    # calls do not overlap (docs/benchmarks/decode_variants.json).
    # The planner takes each count's measured rate (calibration/decode_rates.json).
    gpu_decode_lanes: Count(1, MAX_GPU_DECODE_LANES) = 1
    # encoded, hybrid: the GPU's share of each chunk's rows. auto: in proportion to the measured
    # rates of the GPU and of decode_workers PIL processes (data/footprint.py: gpu_decode_share).
    gpu_decode_share: Union[Literal["auto"], Fraction] = "auto"
    # encoded: GPU memory keeping the first pass's decoded chunks for the grad pass (those are
    # decoded once per step, not twice). auto: as much of the local batch as the planner finds
    # room for beside the chunk (plan/auto_values.py); 0: decode in both passes.
    keep_decoded_gib: Union[Literal["auto"], Annotated[Float, Field(ge=0, le=MAX_GIB)]] = "auto"
    # encoded, pil and torchvision: host memory per rank keeping the first pass's decoded rows that
    # the GPU does not keep (the chunks right after those), in the decode pool's window, for the
    # grad pass: decoded once per step, not twice. auto: every such row, where the node's memory
    # allows (plan/auto_values.py); 0: decode them again. Not with the GPU decoders (nvjpeg, hybrid).
    keep_decoded_host_gib: Union[Literal["auto"], Annotated[Float, Field(ge=0, le=MAX_GIB)]] = "auto"
    # encoded: host memory per rank for rows the decode processes have decoded and the engine has
    # not taken yet (the pool's window): the pool decodes ahead, across passes and steps, until it
    # is full. auto: the smallest window with which the pool decodes through the whole step, from
    # the planned step and the measured decode rates, within the node's memory (plan/auto_values.py).
    decode_window_gib: Union[Literal["auto"], Annotated[Float, Field(gt=0, le=MAX_GIB)]] = "auto"
    # encoded, nvjpeg and hybrid: GPU memory per rank for rows the GPU decoder has decoded ahead of
    # the engine (its lane's window, data/decoding/device_lane.py). auto: 4 GiB, larger where the
    # planned step waits for the lane and a larger window, taken from the rows kept on the GPU
    # between the passes, shortens it (plan/auto_values.py).
    gpu_decode_window_gib: Union[Literal["auto"], Annotated[Float, Field(gt=0, le=MAX_GIB)]] = "auto"
    # encoded: mean stored bytes per image, for the planner (default: measured from the shards
    # where readable)
    image_bytes: Optional[Count(1, MAX_IMAGE_BYTES)] = None

    @field_validator("csv_separator")
    @classmethod
    def _one_character(cls, value):
        # Python's csv module splits on one character; a quote, a line break or NUL cannot
        # separate fields (each means something else to the reader).
        if value is not None and (len(value) != 1 or value in _NOT_SEPARATORS):
            raise ValueError(f"must be one character other than {_NOT_SEPARATORS_TEXT}, got {shown(value)}")
        return value

    @field_validator("train", mode="before")
    @classmethod
    def _paths(cls, value):
        if value is not None and not isinstance(value, (str, list)):
            raise ValueError(f"must be a path or a list of paths, got {type(value).__name__} {shown(value)}")
        return value

    @model_validator(mode="after")
    def _train_for_files(self):
        if self.source != "synthetic" and not self.train:
            raise ValueError(f"data.train is required for data.source={self.source}")
        return self

    @model_validator(mode="after")
    def _host_keep_for_the_processes(self):
        # The GPU decoder's rows are on the device: the pool's window cannot keep them (hybrid's
        # processes decode the chunks their window keeps alone).
        if self.decoder == "nvjpeg" and self.keep_decoded_host_gib not in ("auto", 0):
            raise ValueError(f"data.keep_decoded_host_gib keeps rows the decode processes decoded, and "
                             f"data.decoder={self.decoder} decodes on the GPU: set it to 0 or auto")
        return self


class BatchSection(Section):
    # YAML spells the global batch `global` (a Python keyword, hence the field's name).
    global_size: Count(1, MAX_SAMPLES) = Field(512, alias="global")  # the contrastive batch across all ranks
    # Samples encoded at once (activation memory); auto: the largest power of two (at most
    # 2048) whose planned peak fits 90% of this GPU's memory, the one that keeps the most decoded
    # rows where that makes the step shorter (plan/auto_values.py).
    chunk: Union[Count(1, MAX_SAMPLES), Literal["auto"]] = 64
    offload_features: bool = False               # cached features in pinned host memory


class OptimizerSection(Section):
    lr: Annotated[Float, Field(gt=0)] = 5e-4
    weight_decay: NonNegativeFloat = 0.2         # OpenCLIP's rule decides which parameters decay
    betas: Annotated[List[Annotated[Float, Field(ge=0, lt=1)]], Field(min_length=2, max_length=2)] = [0.9, 0.98]
    eps: Annotated[Float, Field(gt=0)] = 1e-6
    grad_clip: NonNegativeFloat = 0.0            # OpenCLIP clips nothing; DeepSpeed's default would be 1.0


class ScheduleSection(Section):
    steps: Count(1, MAX_STEPS) = 100             # optimizer steps in the run
    warmup_steps: Count(0, MAX_STEPS) = 10
    min_lr_ratio: Fraction = 0.0                 # cosine floor as a fraction of lr

    @model_validator(mode="after")
    def _warmup_within_run(self):
        if self.warmup_steps > self.steps:
            raise ValueError(f"schedule.warmup_steps must be in [0, schedule.steps={self.steps}], "
                             f"got {self.warmup_steps}")
        return self


class PrecisionSection(Section):
    dtype: Literal["bf16", "fp32"] = "bf16"
    grad_accum_fp32: bool = True                 # bf16 only: chunk gradients summed in fp32


class ZeroSection(Section):
    stage: Literal[0, 1, 2, 3] = 2
    base_config: Optional[Text] = None           # default: infcl_ds/ds_configs/zero{stage}.json
    # merged into the DeepSpeed config's zero_optimization block last (DeepSpeedZeroConfig's keys)
    overrides: Dict[str, Any] = {}


class DeepSpeedSection(Section):
    # merged into the whole DeepSpeed config last; the keys the recipe sets are refused
    # (_OWNED_DEEPSPEED_KEYS), and ZeRO's own go in zero.overrides
    overrides: Dict[str, Any] = {}


class CheckpointSection(Section):
    every: Count(0, MAX_STEPS) = 0               # steps between checkpoints (0: only at the end)
    keep: Count(1, MAX_STEPS) = 2                # newest checkpoints kept
    resume: Optional[Text] = None                # "latest" or a tag


class LoggingSection(Section):
    every: Count(1, MAX_STEPS) = 1
    tensorboard: bool = True
    progress: bool = True


class EvalSection(Section):
    every: Count(0, MAX_STEPS) = 0               # steps between evaluations (0: only at the end)
    batch_size: Count(1, MAX_EVAL_BATCH) = 256


MAX_TIMEOUT_MIN = 365 * 24 * 60


class DistributedSection(Section):
    timeout: Optional[float] = None              # minutes a rank waits on a peer, from 1 s to a year
                                                 # (what a timedelta holds); default: DEEPSPEED_TIMEOUT, else 30

    @field_validator("timeout", mode="before")
    @classmethod
    def _positive_minutes(cls, value):
        # One message for every bad value (a bool, a word, zero, a negative number, infinity).
        if value is None:
            return value
        minutes = as_number(value)
        if minutes is None or not 1 / 60 <= minutes <= MAX_TIMEOUT_MIN:
            raise ValueError(f"must be a number of minutes from 1/60 (one second) to {MAX_TIMEOUT_MIN:,} "
                             f"(a year), got {shown(value)}")
        return minutes


class Recipe(Section):
    output_dir: Text = "runs/default"
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    batch: BatchSection = BatchSection()
    optimizer: OptimizerSection = OptimizerSection()
    schedule: ScheduleSection = ScheduleSection()
    precision: PrecisionSection = PrecisionSection()
    zero: ZeroSection = ZeroSection()
    deepspeed: DeepSpeedSection = DeepSpeedSection()
    checkpoint: CheckpointSection = CheckpointSection()
    logging: LoggingSection = LoggingSection()
    eval: EvalSection = EvalSection()
    distributed: DistributedSection = DistributedSection()

    @field_validator("output_dir")
    @classmethod
    def _usable_path(cls, value: str) -> str:
        # Refused at load, on every rank alike, rather than as an OSError or a ValueError from
        # the first mkdir (NAME_MAX is 255 bytes on Linux, macOS and the usual cluster file
        # systems; PATH_MAX 4096).
        if "\0" in value:
            raise ValueError("must not contain a NUL character")
        longest = max((part for part in value.split("/")), key=lambda part: len(part.encode()))
        if len(longest.encode()) > 255:
            raise ValueError(f"has a name of {len(longest.encode())} bytes ({shown(longest, 40)}); "
                             "file systems take at most 255 per name")
        if len(value.encode()) >= 4096:
            raise ValueError(f"is {len(value.encode()):,} bytes long; paths take at most 4095")
        return value

    @model_validator(mode="before")
    @classmethod
    def _empty_sections(cls, tree):
        """A section written with no keys (``model:``) is YAML's null: the defaults."""
        if isinstance(tree, dict):
            return {key: ({} if value is None and key in cls.model_fields and key != "output_dir" else value)
                    for key, value in tree.items()}
        return tree

    @model_validator(mode="after")
    def _across_sections(self):
        if self.batch.chunk != "auto" and self.batch.chunk > self.batch.global_size:
            raise ValueError(f"batch.chunk={self.batch.chunk} is larger than batch.global={self.batch.global_size}")
        if self.data.synthetic_size is None:
            self.data.synthetic_size = max(SYNTHETIC_SIZE, self.batch.global_size)
        if self.data.source == "synthetic" and self.data.synthetic_size < self.batch.global_size:
            raise ValueError(f"data.synthetic_size={self.data.synthetic_size} is smaller than one global batch "
                             f"(batch.global={self.batch.global_size}): not one step could run")
        float8_refused = float8_stage_refusal(self.model.float8, self.zero.stage)
        if float8_refused:
            raise ValueError(float8_refused)
        compile_refused = compile_stage_refusal(self.zero.stage) if self.model.compile is True else None
        if compile_refused:
            raise ValueError(compile_refused)
        _check_overrides(self)
        return self

    def local_batch(self, world_size: int) -> int:
        return self.batch.global_size // world_size

    def compiles(self, device_type: str) -> bool:
        """Whether ranks on `device_type` ("cuda", "cpu") compile the towers (model.compile)."""
        if self.model.compile == "auto":
            return device_type == "cuda" and compile_supported(self.zero.stage)
        return self.model.compile


# DeepSpeed keys the recipe sets itself (config/deepspeed_config.py): an override, or a key of
# the user's own zero.base_config, would silently change the step (e.g. gradient_accumulation_steps
# > 1 steps the optimizer less often, and the engine's gradient scaling assumes 1) or be silently
# ignored (an optimizer or scheduler section: DeepSpeed takes the recipe's, handed to it by the
# engine, and drops the config's). The recipe key to use instead. A zero.base_config may hold the
# two the packaged bases hold, which the recipe writes over (deepspeed_config.WRITTEN_OVER_IN_BASE).
_OWNED_DEEPSPEED_KEYS = {
    "train_micro_batch_size_per_gpu": "batch.chunk", "gradient_accumulation_steps": "batch.global",
    "train_batch_size": "batch.global", "gradient_clipping": "optimizer.grad_clip",
    "bf16": "precision.dtype", "fp16": "precision.dtype", "scheduler": "schedule.*",
    "optimizer": "optimizer.*",
}
# Sections of the DeepSpeed config that are mappings: an override must be one too.
_MAPPING_DEEPSPEED_KEYS = ("data_types", "bf16", "fp16", "activation_checkpointing",
                           "flops_profiler", "comms_logger", "tensorboard", "wandb", "csv_monitor")


def owned_key(config: Dict[str, Any]) -> Optional[str]:
    """The first key of a DeepSpeed config (deepspeed.overrides, a zero.base_config) that the recipe
    sets itself, as the one line refusing it; None if there is none."""
    for key, instead in _OWNED_DEEPSPEED_KEYS.items():
        if key in config:
            return f"{key} is set by the recipe; use {instead}"
    return None


def recipe_key_of(deepspeed_key: str) -> str:
    """The recipe key that sets a DeepSpeed key the recipe owns ("bf16" -> "precision.dtype")."""
    return _OWNED_DEEPSPEED_KEYS[deepspeed_key]


def _check_overrides(recipe: Recipe) -> None:
    """The overrides' rules that need only the recipe; which keys zero.overrides may hold is
    DeepSpeed's to say (config/deepspeed_config.py asks its DeepSpeedZeroConfig)."""
    if "stage" in recipe.zero.overrides:
        raise ValueError("zero.overrides.stage is set by the recipe; use zero.stage")
    overrides = recipe.deepspeed.overrides
    owned = owned_key(overrides)
    if owned:
        raise ValueError(f"deepspeed.overrides.{owned}")
    if "zero_optimization" in overrides:
        raise ValueError("deepspeed.overrides.zero_optimization: ZeRO's keys go in zero.overrides "
                         "(merged into zero_optimization)")
    for key in _MAPPING_DEEPSPEED_KEYS:
        if key in overrides and not isinstance(overrides[key], dict):
            raise ValueError(f"deepspeed.overrides.{key} must be a mapping, got {shown(overrides[key])}")
    accum = overrides.get("data_types", {}).get("grad_accum_dtype")
    if accum is not None and recipe.precision.dtype == "bf16":
        # DeepSpeed's own fp32 accumulation (BF16_Optimizer) cannot coalesce a step's chunks into
        # one reduction (NotImplementedError under ZeRO-1); the engine sums chunk gradients in fp32.
        raise ValueError("deepspeed.overrides.data_types.grad_accum_dtype is not supported with bf16; "
                         "precision.grad_accum_fp32 (default true) sums the chunk gradients in fp32")


# --- errors as one line naming the key -----------------------------------------------------

_KINDS = {"int_type": "must be an integer", "int_parsing": "must be an integer", "int_from_float": "must be an integer",
          "float_type": "must be a number", "float_parsing": "must be a number",
          "finite_number": "must be a finite number", "string_type": "must be a string",
          "bool_type": "must be true or false", "bool_parsing": "must be true or false",
          "dict_type": "must be a mapping", "model_type": "must be a mapping",
          "model_attributes_type": "must be a mapping", "list_type": "must be a list"}


def _field(loc) -> Tuple[str, Any]:
    """The recipe key of a pydantic error location (field names in YAML spelling down the
    sections, then list indices), and the field's annotation where the location goes on into the
    members of a union of choices (their tags, 'literal['auto']', 'bool', are not keys), else None."""
    parts, model, annotation, union = [], Recipe, None, None
    for item in loc:
        if model is not None and isinstance(item, str):
            fields = {(f.alias or name): f for name, f in model.model_fields.items()}
            if item not in fields:
                parts.append(item)  # an unknown key
                break
            parts.append(item)
            annotation = fields[item].annotation
            model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        elif isinstance(item, int):
            parts[-1] += f"[{item}]"
        elif _members(annotation):
            union = annotation
            break
    return ".".join(parts), union


def _members(annotation) -> List[Any]:
    """The choices of a union field (None left out: a key left out is its default), or []."""
    if get_origin(annotation) is not Union:
        return []
    members = [member for member in get_args(annotation) if member is not type(None)]
    return members if len(members) > 1 else []


def _limit(value) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _bounds(metadata) -> str:
    """'from 0 to 1', '> 0', ... of a field's constraints (Field(ge=...) and the like)."""
    limits = {}
    for item in metadata:
        for constraint in (item.metadata if isinstance(item, FieldInfo) else [item]):
            for name, kind in (("ge", annotated_types.Ge), ("gt", annotated_types.Gt), ("le", annotated_types.Le),
                               ("lt", annotated_types.Lt)):
                if isinstance(constraint, kind):
                    limits[name] = getattr(constraint, name)
    if "ge" in limits and "le" in limits:
        return f"from {_limit(limits['ge'])} to {_limit(limits['le'])}"
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return " and ".join(f"{signs[name]} {_limit(value)}" for name, value in limits.items())


def _choice_words(member) -> List[str]:
    """How a message names one member of a union: its literal values, true and false, or a
    kind with its bounds ('a number from 0 to 1')."""
    base, *metadata = get_args(member) if get_origin(member) is Annotated else (member,)
    if get_origin(base) is Literal:
        return [str(value) for value in get_args(base)]
    if base is bool:
        return ["true", "false"]
    if get_origin(base) is list:  # 'a list of strings'
        return ["a list of " + " ".join(_choice_words(get_args(base)[0])).split(" ", 1)[1] + "s"]
    noun = {int: "an integer", float: "a number", str: "a string"}.get(base, getattr(base, "__name__", str(base)))
    return [f"{noun} {_bounds(metadata)}".strip()]


def _choices(union) -> str:
    """'auto, true or false': every valid choice of a union field."""
    words = [word for member in _members(union) for word in _choice_words(member)]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _unknown_key(dotted: str) -> RecipeError:
    *path, key = dotted.split(".")
    model = Recipe
    for part in path:
        model = model.model_fields[part].annotation
    valid = [f.alias or name for name, f in model.model_fields.items()]
    prefix = ".".join(path) + "." if path else ""
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean {prefix}{near[0]}?" if near else f"; valid keys: {', '.join(valid)}"
    return RecipeError(f"recipe: unknown key {dotted}{hint}")


def _recipe_error(err: ValidationError) -> RecipeError:
    e = err.errors()[0]
    key, union = _field(e["loc"])
    if e["type"] == "extra_forbidden":
        return _unknown_key(key)
    if e["type"] == "value_error":  # a check across keys: its message names them
        message = str(e["ctx"]["error"])
        return RecipeError(f"recipe: {message}" if not key or key.split(".")[0] in message else
                           f"recipe: {key} {message}")
    if union is not None:
        # pydantic reports each member's error; the first member's input is the value given.
        return RecipeError(f"recipe: {key} must be {_choices(union)}, got {shown(e['input'])}")
    ctx = e.get("ctx", {})
    if e["type"] == "literal_error":
        kind = f"must be one of {ctx['expected']}"
    elif e["type"] in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        sign, name = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
                      "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}[e["type"]]
        kind = f"must be {sign} {_limit(ctx[name])}"
    elif e["type"] in ("too_short", "too_long"):
        kind = (f"must have at least {ctx['min_length']} entries" if e["type"] == "too_short" else
                f"must have at most {ctx['max_length']} entries")
    elif e["type"] == "string_too_short":
        kind = "must not be empty"
    else:
        kind = _KINDS.get(e["type"], e["msg"].lower())
    return RecipeError(f"recipe: {key} {kind}, got {shown(e['input'])}")


# --- loading ---------------------------------------------------------------------------------

def _read_tree(path: Path) -> Dict[str, Any]:
    if path.is_dir():
        raise RecipeError(f"recipe: {path} is a directory, not a recipe file")
    if not path.is_file():
        raise RecipeError(f"recipe: {path} does not exist")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise RecipeError(f"recipe: {path} is not a text (YAML) file") from None
    try:
        tree = recipe_yaml.load(text)  # safe: a tag that would run code is an error, never run
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise RecipeError(f"recipe: {path}{where}: {problem}") from None
    if tree is None:
        raise RecipeError(f"recipe: {path} is empty (it would train the built-in defaults); "
                          "leave out --config for that")
    if not isinstance(tree, dict):
        raise RecipeError(f"recipe: {path} must be a mapping of sections, got a {type(tree).__name__}")
    return tree


def _apply_override(tree: Dict[str, Any], assignment: str) -> None:
    # The assignment as errors name it: quoted, and cut short whatever was passed.
    arg = shown(assignment, 80)
    if "=" not in assignment:
        raise RecipeError(f"--set {arg}: expected section.key=value")
    dotted, text = assignment.split("=", 1)
    keys = dotted.strip().split(".")
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise RecipeError(f"--set {arg}: {key} is not a section")
    try:
        node[keys[-1]] = recipe_yaml.load(text)  # the recipe file's rules
    except recipe_yaml.RecipeYAMLError as err:  # well-formed YAML, refused: the problem itself
        raise RecipeError(f"--set {arg}: {err.problem}") from None
    except yaml.YAMLError as err:
        problem = str(getattr(err, "problem", None) or err).splitlines()[0]  # one line, whatever YAML says
        raise RecipeError(f"--set {arg}: not a YAML value ({problem})") from None


def _check_model_name(name: str) -> None:
    """The architecture exists (open_clip's configs and the tiny ones shipped here)."""
    import open_clip

    from ..models import register_tiny_configs
    register_tiny_configs()
    known = open_clip.list_models()
    if name not in known:
        near = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
        hint = f"; closest: {', '.join(near)}" if near else "; see open_clip.list_models()"
        raise RecipeError(f"recipe: model.name {shown(name)} is not an open_clip architecture{hint}")


def check_world(recipe: Recipe, world_size: int) -> None:
    """The batch arithmetic for a given number of ranks; raised on every rank before any collective."""
    b = recipe.batch
    if world_size > b.global_size:
        raise RecipeError(f"recipe: batch.global={b.global_size} is smaller than the world size {world_size}: each "
                          "rank needs a sample")
    if b.global_size % world_size:
        raise RecipeError(f"recipe: batch.global={b.global_size} is not divisible by the world size {world_size} "
                          f"(nearest valid: {b.global_size // world_size * world_size} or "
                          f"{(b.global_size // world_size + 1) * world_size})")
    local = b.global_size // world_size
    if b.chunk != "auto" and b.chunk > local:
        raise RecipeError(f"recipe: batch.chunk={b.chunk} is larger than the local batch {local} "
                          f"(batch.global={b.global_size} over {world_size} ranks)")


def read_recipe(path: Optional[Union[str, Path]] = None, overrides: Optional[List[str]] = None) -> Recipe:
    """Read a YAML recipe (or start from the defaults), apply ``section.key=value`` overrides,
    validate every key and the model name; RecipeError otherwise. The DeepSpeed settings built
    from it are checked by load_recipe (config/load.py), which programs call."""
    tree: Dict[str, Any] = _read_tree(Path(path)) if path is not None else {}
    for assignment in overrides or []:
        _apply_override(tree, assignment)
    try:
        recipe = Recipe.model_validate(tree)
    except ValidationError as err:
        raise _recipe_error(err) from None
    _check_model_name(recipe.model.name)
    return recipe


def dump_recipe(recipe: Recipe) -> str:
    """YAML that load_recipe reads back to the same recipe."""
    return yaml.safe_dump(recipe.model_dump(by_alias=True), sort_keys=False)
