"""A diverged run (a learning rate far too high, an overflow) stops at the step where it
diverged, with one line naming that step and the last checkpoint, and never saves weights
that are no longer finite.

Every signal used here is the same on every rank, so all ranks stop at the same step and none
waits in a collective: the loss is the global one (the ring returns it to every rank),
DeepSpeed's gradient norm is the global one, and the loss's own finiteness check of the
features is shared across ranks before any rank raises (parallel.check_across_ranks): every
rank raises validation.NonFiniteFeaturesError, which the trainer turns into `diverged(step,
err.problem, ...)`. The check of the weights before a save is one all-reduce, where every rank
is saving.
"""
import math
from pathlib import Path

import torch

from ..checkpoint.tags import read_latest


class DivergedError(ValueError):
    """The run's numbers are no longer finite: the run cannot go on as configured."""


ADVICE = "lower optimizer.lr or set optimizer.grad_clip"


def _last_checkpoint(checkpoint_dir: Path) -> str:
    tag = read_latest(checkpoint_dir)
    return f"the last checkpoint is {tag}" if tag else "no checkpoint was written"


def diverged(step: int, what: str, checkpoint_dir: Path) -> DivergedError:
    return DivergedError(f"step {step}: the run diverged: {what}; {ADVICE}; {_last_checkpoint(checkpoint_dir)}")


def check_step(step: int, loss: torch.Tensor, grad_norm, checkpoint_dir: Path) -> None:
    """DivergedError if the step's loss or gradient norm is not finite."""
    value = float(loss)
    if not math.isfinite(value):
        raise diverged(step, f"the loss is {value}", checkpoint_dir)
    if grad_norm is not None and not math.isfinite(float(grad_norm)):
        raise diverged(step, f"the gradient norm is {float(grad_norm)}", checkpoint_dir)


def check_weights(parameters, step: int, checkpoint_dir: Path, device, world: int) -> None:
    """DivergedError on every rank if any rank holds a weight that is not finite (its shard
    under ZeRO-3): such a checkpoint would only resume into the same NaNs."""
    local = [getattr(p, "ds_tensor", None) if hasattr(p, "ds_tensor") else p for p in parameters]  # ZeRO-3: the shard
    bad = any(not bool(torch.isfinite(t.detach()).all()) for t in local if t is not None and t.numel())
    flag = torch.tensor([float(bad)], device=device)
    if world > 1:
        import deepspeed.comm as dist
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        raise diverged(step, "weights are no longer finite after the optimizer step, not saved", checkpoint_dir)
