"""The learning-rate schedule: linear warm-up, then cosine decay to a floor (open_clip's
``cosine_lr``).

Step s (1-based) uses ``lr * ratio(s)``: ``s / warmup`` during the ``warmup`` steps, then a
cosine from 1 down to ``min_ratio`` over the remaining steps. So step 1 already moves the
parameters (DeepSpeed's ``WarmupCosineLR`` gives it, and with one warm-up step also step 2, a
rate of 0). A ``LambdaLR``, handed to DeepSpeed as its ``lr_scheduler``: stepped after each
optimizer step, its counters saved in the checkpoint.
"""
import math

import torch


def lr_ratio(step: int, total_steps: int, warmup_steps: int, min_ratio: float) -> float:
    """The multiplier of the base rate at 1-based ``step``."""
    if step <= warmup_steps:
        return step / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - 1 - warmup_steps) / decay_steps)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_cosine(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int,
                  min_ratio: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR counts completed steps from 0: after ``c`` steps the next one is step ``c + 1``."""
    def ratio(completed: int) -> float:
        return lr_ratio(completed + 1, total_steps, warmup_steps, min_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, ratio)
