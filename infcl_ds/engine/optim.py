"""OpenCLIP's optimizer defaults, decided on the unwrapped model before deepspeed.initialize
(under ZeRO-3 a parameter's shape is its shard's, so the decay rule must look first)."""
from typing import Dict, List

import torch

CLIP_ADAMW = {"betas": (0.9, 0.98), "eps": 1e-6, "weight_decay": 0.2}


def exclude_from_decay(name: str, param: torch.nn.Parameter) -> bool:
    """OpenCLIP's rule: no decay for parameters with fewer than 2 dimensions, norms, biases
    and the logit scale (also the embeddings open_clip stores as 2-D: none here)."""
    return param.ndim < 2 or "bn" in name or "ln" in name or "norm" in name or "bias" in name or "logit_scale" in name


def clip_param_groups(model: torch.nn.Module, weight_decay: float = CLIP_ADAMW["weight_decay"]) -> List[Dict]:
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if exclude_from_decay(name, param) else decay).append(param)
    # The engine orders these for DeepSpeed's flat buffers (engine/params.py: align_for_flat_buffers).
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


def clip_adamw(model: torch.nn.Module, lr: float, weight_decay: float = CLIP_ADAMW["weight_decay"]):
    """torch AdamW with CLIP's betas/eps over OpenCLIP's decay groups (FusedAdam's JIT build
    fails on the H100/H200 image with deepspeed 0.19.8; torch's fused AdamW needs no build)."""
    return torch.optim.AdamW(clip_param_groups(model, weight_decay), lr=lr,
                             betas=CLIP_ADAMW["betas"], eps=CLIP_ADAMW["eps"])
