"""What the CLIP loss Function (parallel/ring_loss.py) takes from this layer besides the block
kernels: its options, the positive-pair sum, and the double-backward guard (which the
sigmoid loss's Functions share)."""
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class KernelOptions:
    """How the loss is computed (not what): see infcl_ds.contrastive_loss."""
    backend: str = "auto"
    allow_tf32: bool = True
    panel: Optional[int] = None  # columns per backward panel; None = memory-derived
    panel_rows: Optional[int] = None  # rows per backward G tile; None = memory-derived


def positive_logits_sum(a: torch.Tensor, b: torch.Tensor, chunk: int = 1 << 16) -> torch.Tensor:
    """sum_i a_i . b_i: row dots in fp32, their sum in fp64 (the loss subtracts s times this
    from the log-sum-exps, a difference of O(s) numbers). Chunked: no [B, D] fp32 copy."""
    total = torch.zeros((), device=a.device, dtype=torch.float64)
    for i in range(0, a.shape[0], chunk):
        total += (a[i:i + chunk].float() * b[i:i + chunk].float()).sum(1).double().sum()
    return total


def refuse_double_backward(loss: str = "contrastive loss") -> None:
    """Called first in a backward: grad mode is on there only under ``create_graph=True``,
    which asks for gradients of these gradients (not implemented by the tile kernels; the
    gradients returned would be constants, silently wrong for a gradient penalty)."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"infcl_ds: double backward (create_graph=True, higher-order gradients) of the "
                           f"{loss} is not supported")
