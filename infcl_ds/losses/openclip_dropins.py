"""Drop-ins for OpenCLIP users: ``infcl_ds.ClipLoss`` and ``infcl_ds.SigLipLoss`` in place of
``open_clip.loss.ClipLoss`` and ``open_clip.loss.SigLipLoss``.

    from infcl_ds import ClipLoss, SigLipLoss     # was: from open_clip.loss import ...
    clip_fn = ClipLoss(local_loss=True, gather_with_grad=True, rank=rank, world_size=world_size)
    siglip_fn = SigLipLoss(rank=rank, world_size=world_size)

Both compute the exact global loss without B x B logits and without gathering features:
every rank returns the global loss, which equals the mean of OpenCLIP's per-rank losses.
After DDP's averaging the parameter gradients are OpenCLIP's. For that, the feature
gradients are multiplied by the world size on their way back (DDP divides by it; in
OpenCLIP each rank's loss reaches every rank's features through the gather or exchange),
and the scale (and bias) gradients, already the full ones on every rank, are left alone.
See docs/semantics.md.

In a program that set up torch.distributed itself (OpenCLIP's trainer), the ring runs on
torch.distributed: DeepSpeed is neither imported nor initialised (parallel/comm.py).
"""
import warnings

import torch
import torch.distributed as torch_dist
from torch import nn

from ..parallel import group_size
from ._prologue import check_loss_options
from .clip import contrastive_loss, contrastive_loss_with_unused_bias
from .siglip import sigmoid_loss

# OpenCLIP's ClipLoss flags whose gradients this loss reproduces (with any others it warns once).
EQUIVALENT_FLAGS = {"local_loss": True, "gather_with_grad": True}
_warned_flags = False
DIST_IMPLS = ("bidir", "shift", "reduce", "gather")


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


def _features_for_ddp(owner: str, world_size: int, group, image_features, text_features):
    """The features with gradients scaled by the group's size, undoing DDP's average (the
    group must have ``world_size`` ranks)."""
    size = group_size(group)
    if size != world_size:
        raise ValueError(f"{owner}: world_size={world_size} but the process group has {size} ranks")
    return scale_grad(image_features, size), scale_grad(text_features, size)


class ClipLoss(nn.Module):
    """OpenCLIP's ClipLoss interface over infcl_ds's exact tiled loss.

    The constructor's flags are kept as attributes (``local_loss``, ``gather_with_grad``,
    ``cache_labels``, ``rank``, ``world_size``, ``use_horovod``), as OpenCLIP code and
    subclasses read them, but the result is the same whichever is set: the loss is always
    the exact global one. ``world_size`` is the data-parallel size whose averaging is
    compensated; it must match the process group. Horovod is not supported.

    Gradients are those of open_clip's ClipLoss(local_loss=True, gather_with_grad=True).
    With other flags on more than one rank, rank 0 warns once: a run that used open_clip's
    default (gather_with_grad=False: gathered features carry no gradient) had encoder
    gradients about W times smaller; with AdamW that changes little, with SGD or a
    gradient-clipping threshold it changes the effective step.

    ``logit_bias`` (passed by open_clip's trainer when the model config has
    ``init_logit_bias``): a scalar bias is accepted and has no effect, since adding one
    constant to every logit leaves each softmax, hence the loss and every gradient,
    unchanged (the bias itself gets a zero gradient, as in open_clip's ClipLoss). Only
    SigLIP's loss, not this one, uses it; it is still checked like every other input: a
    non-scalar bias, or a NaN/Inf one (unless the option check_finite=False), is a
    ValueError naming logit_bias, raised on every rank before any transfer.
    """

    def __init__(self, local_loss=False, gather_with_grad=False, cache_labels=False, rank=0, world_size=1,
                 use_horovod=False, group=None, **options):
        super().__init__()
        if use_horovod:
            raise ValueError("infcl_ds.ClipLoss: use_horovod=True is not supported (torch.distributed only)")
        self.local_loss = local_loss
        self.gather_with_grad = gather_with_grad
        self.cache_labels = cache_labels
        self.rank = rank
        check_loss_options(options, "infcl_ds.ClipLoss", contrastive_loss)
        self.world_size = world_size
        self.use_horovod = use_horovod
        self.group = group
        self.options = options
        self._warn_if_flags_differ()

    def _warn_if_flags_differ(self) -> None:
        global _warned_flags
        flags = {"local_loss": self.local_loss, "gather_with_grad": self.gather_with_grad}
        if self.world_size > 1 and self.rank == 0 and flags != EQUIVALENT_FLAGS and not _warned_flags:
            _warned_flags = True
            warnings.warn(f"infcl_ds.ClipLoss: gradients are those of open_clip's ClipLoss(local_loss=True, "
                          f"gather_with_grad=True), not of the flags given ({flags}); with gather_with_grad=False "
                          f"open_clip's encoder gradients are about {self.world_size}x smaller "
                          "(see docs/semantics.md)", stacklevel=3)

    def forward(self, image_features, text_features, logit_scale, logit_bias=None, output_dict=False):
        image_features, text_features = _features_for_ddp("infcl_ds.ClipLoss", self.world_size, self.group,
                                                           image_features, text_features)
        # The bias is checked with the other inputs (a scalar; NaN/Inf a ValueError on every rank).
        loss = contrastive_loss_with_unused_bias(image_features, text_features, logit_scale, logit_bias, self.group,
                                                 **self.options)
        if isinstance(logit_bias, torch.Tensor) and logit_bias.requires_grad:
            loss = loss + 0 * logit_bias.sum()  # its (zero) gradient, as open_clip gives it one
        return {"contrastive_loss": loss} if output_dict else loss

    def get_logits(self, image_features, text_features, logit_scale, logit_bias=None):
        """OpenCLIP's ``get_logits`` with ``local_loss=True, gather_with_grad=True``: this rank's
        rows against the gathered columns, (logits_per_image, logits_per_text), each [b, B].
        For code that inspects logits; it materialises them, which the loss never does."""
        if group_size(self.group) > 1:
            from torch.distributed.nn.functional import all_gather
            group = self.group if self.group is not None else torch_dist.group.WORLD
            all_image = torch.cat(all_gather(image_features, group=group))
            all_text = torch.cat(all_gather(text_features, group=group))
        else:
            all_image, all_text = image_features, text_features
        logits_per_image = logit_scale * image_features @ all_text.T
        logits_per_text = logit_scale * text_features @ all_image.T
        if logit_bias is not None:
            logits_per_image = logits_per_image + logit_bias
            logits_per_text = logits_per_text + logit_bias
        return logits_per_image, logits_per_text


class SigLipLoss(nn.Module):
    """OpenCLIP's SigLipLoss interface over infcl_ds's exact tiled sigmoid loss.

    cache_labels, rank: accepted for compatibility (no labels are built; the rank comes from
    the process group). dist_impl: validated like OpenCLIP's; the result is the same for
    each, as all four of OpenCLIP's compute the same sum (the ring does the exchange).
    world_size: the data-parallel size whose averaging is compensated; it must match the
    process group. group and keyword options (backend, allow_tf32, ...): passed to
    infcl_ds.sigmoid_loss. With uneven local batches OpenCLIP weights each rank's pairs by
    1/its own batch, this loss by 1/global batch (the two agree for equal local batches).
    """

    def __init__(self, cache_labels: bool = False, rank: int = 0, world_size: int = 1, dist_impl=None,
                 group=None, **options):
        super().__init__()
        self.cache_labels = cache_labels
        self.rank = rank
        self.world_size = world_size
        self.dist_impl = dist_impl or "bidir"
        if self.dist_impl not in DIST_IMPLS:
            raise ValueError(f"infcl_ds.SigLipLoss: dist_impl must be one of {DIST_IMPLS}, got {dist_impl!r}")
        # open_clip's constructor takes no other argument: a TypeError, as its own would raise.
        check_loss_options(options, "infcl_ds.SigLipLoss", sigmoid_loss, TypeError)
        self.group = group
        self.options = options

    def forward(self, image_features, text_features, logit_scale, logit_bias, output_dict=False):
        image_features, text_features = _features_for_ddp("infcl_ds.SigLipLoss", self.world_size, self.group,
                                                           image_features, text_features)
        loss = sigmoid_loss(image_features, text_features, logit_scale, logit_bias, self.group, **self.options)
        return {"contrastive_loss": loss} if output_dict else loss
