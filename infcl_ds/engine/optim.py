"""The optimizer: torch's AdamW over OpenCLIP's decay groups, with the recipe's settings
(config/recipe.py, OptimizerSection, owns their defaults). The groups are decided on the
unwrapped model before deepspeed.initialize: under ZeRO-3 a parameter's shape is its shard's,
so the decay rule must look first."""
from typing import Dict, List

import torch

from ..config.recipe import OptimizerSection


def exclude_from_decay(name: str, param: torch.nn.Parameter) -> bool:
    """OpenCLIP's rule: no decay for parameters with fewer than 2 dimensions, norms, biases
    and the logit scale (also the embeddings open_clip stores as 2-D: none here)."""
    return param.ndim < 2 or "bn" in name or "ln" in name or "norm" in name or "bias" in name or "logit_scale" in name


def clip_param_groups(model: torch.nn.Module, weight_decay: float) -> List[Dict]:
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if exclude_from_decay(name, param) else decay).append(param)
    # The engine orders these for DeepSpeed's flat buffers (engine/params.py: align_for_flat_buffers).
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


def clip_adamw(model: torch.nn.Module, settings: OptimizerSection) -> torch.optim.AdamW:
    """torch's AdamW (DeepSpeed's FusedAdam needs a JIT build, which fails on the H100/H200
    image) in its default implementation, for the trainer and the benchmarks alike."""
    return torch.optim.AdamW(clip_param_groups(model, settings.weight_decay), lr=settings.lr,
                             betas=tuple(settings.betas), eps=settings.eps)
