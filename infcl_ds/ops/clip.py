"""Single-device bidirectional CLIP loss as an autograd Function over one block."""
from dataclasses import dataclass
from typing import Optional

import torch

from .block import block_backward, block_lse


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


def refuse_double_backward() -> None:
    """Called first in a backward: grad mode is on there only under ``create_graph=True``,
    which asks for gradients of these gradients (not implemented by the tile kernels)."""
    if torch.is_grad_enabled():
        raise RuntimeError("infcl_ds: double backward (create_graph=True, higher-order gradients) of the "
                           "contrastive loss is not supported")


class TiledClipLoss(torch.autograd.Function):
    """Mean bidirectional CLIP loss of one device's whole batch; O(B*D) memory.

    forward: row/column log-sum-exp in one pass over the tiles (ops/lse.py).
    backward: each tile recomputed once for both directions (ops/grad_panel.py).
    """

    @staticmethod
    def forward(ctx, image, text, scale, options: KernelOptions):
        n = image.shape[0]
        s = scale.detach().reshape(1).float()
        row_lse, col_lse = block_lse(image, text, s, backend=options.backend, allow_tf32=options.allow_tf32)
        loss = ((row_lse.double().sum() + col_lse.double().sum()) / (2 * n)
                - s[0].double() * positive_logits_sum(image, text) / n).float()
        ctx.save_for_backward(image, text, s, row_lse, col_lse)
        ctx.options = options
        ctx.scale_shape, ctx.scale_dtype = scale.shape, scale.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        refuse_double_backward()
        image, text, s, row_lse, col_lse = ctx.saved_tensors
        n = image.shape[0]
        opt = ctx.options
        # One host sync: the GEMMs take the factor g*s/(2B) as a plain float.
        coef = float(grad_loss * s[0]) / (2 * n)
        grad_image = torch.zeros(image.shape, device=image.device, dtype=torch.float32)
        grad_text = torch.empty_like(text)
        ds = block_backward(image, text, s, row_lse, col_lse, coef, diag=True,
                            grad_a=grad_image, grad_b=grad_text, accumulate_b=False,
                            backend=opt.backend, allow_tf32=opt.allow_tf32, panel=opt.panel, rows=opt.panel_rows)
        grad_scale = (grad_loss.double() * ds / (2 * n)).to(ctx.scale_dtype).reshape(ctx.scale_shape)
        return grad_image.to(image.dtype), grad_text, grad_scale, None
