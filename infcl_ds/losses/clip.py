"""The exact bidirectional CLIP (softmax) loss over a (possibly distributed) batch.

    loss = contrastive_loss(image_features, text_features, logit_scale, group=None)

``logit_scale`` is the multiplier s (open_clip's ``logit_scale.exp()``). The loss is the
mean of the image->text and text->image cross-entropies over the global batch, positives
on the diagonal, and its gradients are those of one process holding the whole batch.
"""
from typing import Optional, Tuple

import torch
from torch import nn

from ..parallel import ClipLossFunction
from ._prologue import apply_loss, check_loss_options, kernel_options


def contrastive_loss(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale,
                     group=None, *, check_finite: bool = True, allow_tf32: Optional[bool] = None,
                     backend: str = "auto", _g_tile: Optional[Tuple[int, int]] = None) -> torch.Tensor:
    """Mean bidirectional CLIP loss; never materialises the B x B logits.

    Args:
        image_features, text_features: [b, D], fp32/bf16/fp16, same device (CUDA or CPU).
            Usually L2-normalised, but any finite values whose logits fit in float32 are
            exact (larger ones are a ValueError with check_finite).
        logit_scale: the multiplier s, 0-dim or 1-element tensor (may require grad).
        group: process group; None is the default group when torch.distributed is
            initialised. Without one, or with a group of one rank, the single-device loss.
            Over several ranks: the exact loss of the concatenated batch (group order) by a
            ring (over deepspeed.comm under DeepSpeed, else torch.distributed); every rank
            returns it, each rank gets the gradients of its own features, and the
            logit-scale gradient is the full one on every rank.
        check_finite: reject NaN/Inf inputs with a ValueError (one host sync); False skips it.
        allow_tf32: whether fp32 inputs use TF32 tensor cores (~1e-3 relative error) or IEEE
            fp32 products. None (default) follows PyTorch's own setting: TF32 only after
            torch.set_float32_matmul_precision("high") or
            torch.backends.cuda.matmul.allow_tf32 = True. No effect on bf16/fp16.
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, chunked PyTorch on
            CPU), "triton" or "torch".
    """
    return contrastive_loss_with_unused_bias(image_features, text_features, logit_scale, None, group,
                                             check_finite=check_finite, allow_tf32=allow_tf32, backend=backend,
                                             _g_tile=_g_tile)


def contrastive_loss_with_unused_bias(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale,
                                      logit_bias, group=None, *, check_finite: bool = True,
                                      allow_tf32: Optional[bool] = None, backend: str = "auto",
                                      _g_tile: Optional[Tuple[int, int]] = None) -> torch.Tensor:
    """contrastive_loss of inputs that include a logit bias (OpenCLIP's ClipLoss takes one).

    A scalar bias adds one constant to every logit and cancels in each softmax, so it is not
    read; it is checked with the other inputs, before any transfer: not a scalar, or NaN/Inf
    with check_finite, is a ValueError naming logit_bias (on every rank). None: no bias."""
    return apply_loss(ClipLossFunction, "contrastive_loss", image_features, text_features, logit_scale, logit_bias,
                      group, kernel_options(backend, allow_tf32, _g_tile), check_finite)


class ContrastiveLoss(nn.Module):
    """``nn.Module`` around :func:`contrastive_loss` (keyword options fixed at construction)."""

    def __init__(self, group=None, **options):
        super().__init__()
        check_loss_options(options, "infcl_ds.ContrastiveLoss", contrastive_loss)
        self.group = group
        self.options = options

    def forward(self, image_features, text_features, logit_scale):
        return contrastive_loss(image_features, text_features, logit_scale, self.group, **self.options)
