"""Drop-in for OpenCLIP users: ``infcl_ds.ClipLoss`` in place of ``open_clip.loss.ClipLoss``.

    from infcl_ds import ClipLoss        # was: from open_clip.loss import ClipLoss
    loss_fn = ClipLoss(local_loss=True, gather_with_grad=True, rank=rank, world_size=world_size)

The exact global loss without B x B logits and without gathering features: every rank
returns the global loss, which equals the mean of OpenCLIP's per-rank local losses; after
DDP's averaging the parameter gradients are those of OpenCLIP's
``ClipLoss(local_loss=True, gather_with_grad=True)``. For that, the feature gradients are
multiplied by the world size on their way back (DDP divides by it; with OpenCLIP's gather
each rank's loss reaches every rank's features), and the logit-scale gradient, already the
full one on every rank, is left alone. See docs/semantics.md.
"""
import torch
from torch import nn

from .loss import _group_size, check_loss_options, contrastive_loss


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``factor`` on the way back."""

    @staticmethod
    def forward(ctx, x, factor: float):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def scale_grad(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x if factor == 1 else _ScaleGrad.apply(x, factor)


class ClipLoss(nn.Module):
    """OpenCLIP's ClipLoss interface over infcl_ds's exact tiled loss.

    local_loss, gather_with_grad, cache_labels, rank, use_horovod: accepted for
    compatibility; the result is the same whichever is set (the loss is always the exact
    global one). world_size: the data-parallel size whose averaging is compensated; it must
    match the process group. Horovod is not supported.

    Gradients are those of open_clip's ClipLoss(local_loss=True, gather_with_grad=True). A
    run that used open_clip's default (gather_with_grad=False: gathered features carry no
    gradient) had encoder gradients W times smaller; with AdamW that changes little, with SGD
    or a gradient-clipping threshold it changes the effective step.
    """

    def __init__(self, local_loss=False, gather_with_grad=False, cache_labels=False, rank=0, world_size=1,
                 use_horovod=False, group=None, **options):
        super().__init__()
        if use_horovod:
            raise ValueError("infcl_ds.ClipLoss: use_horovod=True is not supported (torch.distributed only)")
        check_loss_options(options, "infcl_ds.ClipLoss")
        self.world_size = world_size
        self.group = group
        self.options = options

    def forward(self, image_features, text_features, logit_scale, logit_bias=None, output_dict=False):
        if logit_bias is not None:
            raise ValueError("infcl_ds.ClipLoss: logit_bias is a SigLIP term; the CLIP loss takes none")
        size = _group_size(self.group)
        if size != self.world_size:
            raise ValueError(f"infcl_ds.ClipLoss: world_size={self.world_size} but the process group has {size} ranks")
        image_features = scale_grad(image_features, size)
        text_features = scale_grad(text_features, size)
        loss = contrastive_loss(image_features, text_features, logit_scale, self.group, **self.options)
        return {"contrastive_loss": loss} if output_dict else loss
