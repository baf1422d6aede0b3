"""Public API: the exact bidirectional CLIP loss over a (possibly distributed) batch.

    loss = contrastive_loss(image_features, text_features, logit_scale, group=None)

``logit_scale`` is the multiplier s (open_clip's ``logit_scale.exp()``). The loss is the
mean of the image->text and text->image cross-entropies over the global batch, positives
on the diagonal, and its gradients are those of one process holding the whole batch.
"""
from typing import Optional

import torch
import torch.distributed as torch_dist
from torch import nn

from .ops import KernelOptions
from .parallel import ClipLossFunction, LocalRing
from .validation import check_features


def _group_size(group) -> int:
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        if group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialised")
        return 1
    return torch_dist.get_world_size(group)


def check_loss_options(options: dict, owner: str, loss=None, error=ValueError) -> None:
    """Keyword options for ``loss`` (default: contrastive_loss) given at a module's construction:
    an unknown one is an ``error`` there, not a TypeError at the first forward."""
    import inspect
    loss = contrastive_loss if loss is None else loss
    known = [name for name, p in inspect.signature(loss).parameters.items() if p.kind == p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise error(f"{owner}: unknown argument(s) {', '.join(unknown)}; loss options are {', '.join(known)}")


def contrastive_loss(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale,
                     group=None, *, check_finite: bool = True, allow_tf32: bool = True,
                     backend: str = "auto", panel: Optional[int] = None,
                     panel_rows: Optional[int] = None) -> torch.Tensor:
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
        allow_tf32: fp32 inputs use TF32 tensor cores (~1e-3 relative error); False for
            exact fp32 (IEEE) products. No effect on bf16/fp16.
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, chunked PyTorch on
            CPU), "triton" or "torch".
        panel, panel_rows: columns and rows of the backward's G tiles (tests only; default
            derived from memory).
    """
    options = KernelOptions(backend=backend, allow_tf32=allow_tf32, panel=panel, panel_rows=panel_rows)
    if _group_size(group) == 1:
        scale = check_features(image_features, text_features, logit_scale, check_finite)
        return ClipLossFunction.apply(image_features, text_features, scale, options, LocalRing(),
                                      [image_features.shape[0]])

    from .parallel import Ring, check_across_ranks
    ring = Ring(group)
    # Local problems are shared before any rank raises, so that no peer is left waiting.
    try:
        scale = check_features(image_features, text_features, logit_scale, check_finite)
        error = None
    except ValueError as err:
        scale, error = torch.zeros(()), str(err)
    sizes = check_across_ranks(ring, image_features, text_features, scale, error)
    return ClipLossFunction.apply(image_features, text_features, scale, options, ring, sizes)


class ContrastiveLoss(nn.Module):
    """``nn.Module`` around :func:`contrastive_loss` (keyword options fixed at construction)."""

    def __init__(self, group=None, **options):
        super().__init__()
        check_loss_options(options, "infcl_ds.ContrastiveLoss")
        self.group = group
        self.options = options

    def forward(self, image_features, text_features, logit_scale):
        return contrastive_loss(image_features, text_features, logit_scale, self.group, **self.options)
