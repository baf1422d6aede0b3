"""The exact sigmoid (SigLIP) loss over a (possibly distributed) batch.

    loss = sigmoid_loss(image_features, text_features, logit_scale, logit_bias, group=None)

The sum over all pairs (i, j) of the global batch of -log sigmoid(z_ij (s x_i.y_j + b)),
z = +1 for a positive pair (same index), -1 otherwise, divided by the global batch size;
``logit_scale`` is the multiplier s (open_clip's ``logit_scale.exp()``), ``logit_bias`` the
bias b. Gradients are those of one process holding the whole batch (docs/semantics.md).
"""
from typing import Optional, Tuple

import torch
from torch import nn

from ..parallel import SigLipLossFunction
from ._prologue import apply_loss, check_loss_options, kernel_options


def sigmoid_loss(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale, logit_bias,
                 group=None, *, check_finite: bool = True, allow_tf32: Optional[bool] = None,
                 backend: str = "auto", _g_tile: Optional[Tuple[int, int]] = None) -> torch.Tensor:
    """Sigmoid loss of the global batch; never materialises the B x B logits.

    Args:
        image_features, text_features: [b, D], fp32/bf16/fp16, same device (CUDA or CPU).
        logit_scale: the multiplier s; logit_bias: the bias b. Each a number or a 0-dim or
            1-element tensor (may require grad).
        group: process group; None is the default group when torch.distributed is
            initialised. Over several ranks: the exact loss of the concatenated batch (group
            order) by a ring over deepspeed.comm; every rank returns it, each rank gets the
            gradients of its own features, and the scale and bias gradients are the full
            ones on every rank.
        check_finite, allow_tf32, backend: as for contrastive_loss.

    The gradients are computed together with the loss (one sweep over the tiles) whenever
    an input requires grad; backward only scales them.
    """
    return apply_loss(SigLipLossFunction, "sigmoid_loss", image_features, text_features, logit_scale, logit_bias,
                      group, kernel_options(backend, allow_tf32, _g_tile), check_finite)


class SigmoidLoss(nn.Module):
    """``nn.Module`` around :func:`sigmoid_loss` (keyword options fixed at construction)."""

    def __init__(self, group=None, **options):
        super().__init__()
        check_loss_options(options, "infcl_ds.SigmoidLoss", sigmoid_loss)
        self.group = group
        self.options = options

    def forward(self, image_features, text_features, logit_scale, logit_bias):
        return sigmoid_loss(image_features, text_features, logit_scale, logit_bias, self.group, **self.options)
