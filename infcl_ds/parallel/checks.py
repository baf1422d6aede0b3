"""One small collective before the first transfer: every rank learns every rank's inputs.

A rank whose inputs are bad must not raise alone: its peers would wait in the ring until the
timeout. So local problems are recorded, not raised, shared with one all-gather, and every
rank raises the same ValueError naming the rank(s) and the problem: a NonFiniteFeaturesError
(validation.py) where every failing rank's problem is one, so that a trainer tells a diverged
step by its type on every rank, whichever rank saw the NaN. The table is summed
from zero-padded rows with the ring's all-reduce rather than all-gathered: all_gather_into_tensor
is deprecated in recent torch (a warning on every call) and absent from older ones.
"""
import math
from typing import List, Optional

import torch

from ..validation import NonFiniteFeaturesError
from .ring import Ring

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_DEVICE_CODES = {"cpu": 0, "cuda": 1}


def check_across_ranks(ring: Ring, image: torch.Tensor, text: torch.Tensor, scale: torch.Tensor,
                       local_error: Optional[ValueError], bias: Optional[torch.Tensor] = None,
                       loss_name: str = "contrastive_loss") -> List[int]:
    """Return the local batch sizes in group order, or raise ValueError on every rank.

    local_error: this rank's own input check's error, or None. bias: the sigmoid loss's logit
    bias, checked to agree like the scale (None: no bias)."""
    ok = local_error is None
    row = torch.tensor([
        0.0 if ok else 1.0,
        float(image.shape[0]) if ok else -1.0,
        float(image.shape[1]) if ok else -1.0,
        float(_DTYPE_CODES.get(image.dtype, -1)) if ok else -1.0,
        float(_DEVICE_CODES.get(image.device.type, -1)) if ok else -1.0,
        float(scale.detach().reshape(())) if ok else 0.0,
        float(bias.detach().reshape(())) if ok and bias is not None else 0.0,
    ], dtype=torch.float64, device=ring.device)
    table = torch.zeros((ring.size, row.numel()), dtype=torch.float64, device=row.device)
    table[ring.pos] = row
    rows = ring.all_reduce_sum(table).tolist()
    if any(r[0] for r in rows):
        raise _shared_error(ring, local_error, loss_name)
    names = {"width D": 2, "dtype": 3, "device type": 4, "logit_scale": 5, "logit_bias": 6}
    for what, col in names.items():
        values = [r[col] for r in rows]
        if _differ(values):
            per_rank = ", ".join(f"rank {ring.ranks[i]}: {_describe(col, v)}" for i, v in enumerate(values))
            raise ValueError(f"{loss_name}: {what} differs across ranks ({per_rank})")
    return [int(r[1]) for r in rows]


def _shared_error(ring: Ring, local_error: Optional[ValueError], loss_name: str) -> ValueError:
    """The failing ranks' errors as one, the same on every rank. Each rank shares its message
    and, for a NonFiniteFeaturesError, its problem (the kind travels with the text): where every
    failing rank's is one, a NonFiniteFeaturesError whose problem names them all; else a
    ValueError."""
    mine = None
    if local_error is not None:
        mine = (str(local_error), local_error.problem if isinstance(local_error, NonFiniteFeaturesError) else None)
    shared = [None] * ring.size
    ring.comm.all_gather_object(shared, mine, group=ring.group)
    failed = [(ring.ranks[i], item) for i, item in enumerate(shared) if item is not None]
    message = f"{loss_name}: bad input on " + "; ".join(f"rank {rank}: {text}" for rank, (text, _) in failed)
    if all(problem is not None for _, (_, problem) in failed):
        problem = f"{loss_name}: bad input on " + "; ".join(f"rank {rank}: {p}" for rank, (_, p) in failed)
        return NonFiniteFeaturesError(message, problem)
    return ValueError(message)


def _differ(values: List[float]) -> bool:
    """Whether the ranks' values differ. NaN equals NaN here: with check_finite=False the same
    NaN scale or bias on every rank is that caller's choice, not a disagreement."""
    return len({"nan" if math.isnan(v) else v for v in values}) > 1


def _describe(col: int, value: float) -> str:
    if col == 3:
        return {v: str(k).replace("torch.", "") for k, v in _DTYPE_CODES.items()}.get(int(value), "?")
    if col == 4:
        return {v: k for k, v in _DEVICE_CODES.items()}.get(int(value), "?")
    return f"{value:g}"
