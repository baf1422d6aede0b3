"""`build_engine`: the model, its optimizer and schedule, and the ContrastiveEngine around them,
from a recipe, for this rank; the one way the trainer and `infcl-ds bench train` build them."""
import random
from typing import Callable, Optional

import numpy as np
import torch

from ..config import Recipe, build_deepspeed_config
from ..engine import ContrastiveEngine, EngineSettings
from ..engine.optim import clip_adamw
from ..models import create_model
from .resolve import check_float8
from .schedule import warmup_cosine


def build_engine(recipe: Recipe, world: int, device: torch.device, *,
                 ds_config: Optional[dict] = None, check_model: Optional[Callable[[torch.nn.Module], None]] = None,
                 loss_fn=None, time_phases: bool = False) -> ContrastiveEngine:
    """Every rank calls it (DeepSpeed's set-up is a collective). `recipe.batch.chunk` is a
    number: `auto` is resolved before, by the trainer's one plan (resolve.resolve_recipe and
    agree_on_chunk); building the engine plans nothing.

    The seeds are set from model.seed before the model is created, so its initial weights are
    the recipe's. `ds_config`: the DeepSpeed config (default: built from the recipe; the trainer
    passes a resharding resume's). `check_model(model)` runs before DeepSpeed is set up (the
    trainer's free-disk check: every rank raises alike, before any collective). `loss_fn`
    and `time_phases`: the engine's (the benchmarks' swapped-in losses and phase timings)."""
    check_float8(recipe, device)  # every rank, before any collective
    settings = EngineSettings.from_recipe(recipe, device.type, time_phases=time_phases)
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
    return ContrastiveEngine.create(
        model.to(device), ds_config if ds_config is not None else build_deepspeed_config(recipe, world), settings,
        optimizer=optimizer, loss_fn=loss_fn, lr_scheduler=schedule)
