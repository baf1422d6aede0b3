"""`build_engine`: the model, its optimizer and schedule, and the ContrastiveEngine around them,
from a recipe, for this rank; the one way the trainer and `infcl-ds bench train` build them."""
import random
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from ..config import Recipe, build_deepspeed_config
from ..engine import ContrastiveEngine
from ..engine.optim import clip_adamw
from ..models import create_model
from .resolve import check_float8, resolve_auto_chunk
from .schedule import warmup_cosine


@dataclass(frozen=True)
class BuiltEngine:
    recipe: Recipe                 # with batch.chunk resolved (a number)
    engine: ContrastiveEngine
    optimizer: torch.optim.Optimizer

    @property
    def model(self) -> torch.nn.Module:
        return self.engine.model

    @property
    def chunk(self) -> int:
        return self.recipe.batch.chunk


def build_engine(recipe: Recipe, world: int, device: torch.device, *, rank: int = 0,
                 ds_config: Optional[dict] = None, check_model: Optional[Callable[[torch.nn.Module], None]] = None,
                 loss_fn=None, time_phases: bool = False) -> BuiltEngine:
    """Every rank calls it (`batch.chunk: auto` and DeepSpeed's set-up are collectives).

    The seeds are set from model.seed before the model is created, so its initial weights are
    the recipe's. `ds_config`: the DeepSpeed config (default: built from the recipe; the trainer
    passes a resharding resume's). `check_model(model)` runs before DeepSpeed is set up (the
    trainer's free-disk check: every rank raises alike, before any collective). `loss_fn`
    and `time_phases`: ContrastiveEngine's (the benchmarks' swapped-in losses and phase timings)."""
    check_float8(recipe, device)  # every rank, before any collective
    if recipe.batch.chunk == "auto":
        recipe = resolve_auto_chunk(recipe, world, device, rank)
    random.seed(recipe.model.seed)
    np.random.seed(recipe.model.seed)
    torch.manual_seed(recipe.model.seed)
    model = create_model(recipe.model.name, loss=recipe.model.loss)
    if recipe.model.grad_checkpointing:
        model.set_grad_checkpointing(True)
    if check_model is not None:
        check_model(model)
    optimizer = clip_adamw(model, recipe.optimizer)  # on the unwrapped model (engine/optim.py)
    schedule = warmup_cosine(optimizer, recipe.schedule.steps, recipe.schedule.warmup_steps,
                             recipe.schedule.min_lr_ratio)
    engine = ContrastiveEngine.create(
        model.to(device), ds_config if ds_config is not None else build_deepspeed_config(recipe, world),
        recipe.batch.chunk, optimizer=optimizer, offload_features=recipe.batch.offload_features,
        grad_accum_fp32=recipe.precision.grad_accum_fp32, loss=recipe.model.loss, lr_scheduler=schedule,
        loss_fn=loss_fn, time_phases=time_phases, compile_backend="inductor" if recipe.compiles(device.type) else None,
        float8=recipe.model.float8, gelu_epilogue=recipe.model.gelu_epilogue)
    return BuiltEngine(recipe, engine, optimizer)
