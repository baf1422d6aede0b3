"""Drop-in for OpenCLIP users: ``infcl_ds.SigLipLoss`` in place of ``open_clip.loss.SigLipLoss``.

    from infcl_ds import SigLipLoss      # was: from open_clip.loss import SigLipLoss
    loss_fn = SigLipLoss(rank=rank, world_size=world_size)
    loss = loss_fn(image_features, text_features, logit_scale, logit_bias)

The exact global sigmoid loss without B x B logits: every rank returns the global loss,
which equals the mean of OpenCLIP's per-rank losses (each of those sums its images against
every text and divides by the local batch). After DDP's averaging the parameter gradients
are OpenCLIP's, whatever its ``dist_impl`` (all four compute the same sum): the feature
gradients are multiplied by the world size on their way back (DDP divides by it; in
OpenCLIP each rank's loss reaches every rank's text features through the exchange), and
the scale and bias gradients, already the full ones on every rank, are left alone. With
uneven local batches OpenCLIP weights each rank's pairs by 1/its own batch; this loss by
1/global batch (the two agree for equal local batches). See docs/semantics.md.
"""
from torch import nn

from .clip_loss import scale_grad
from .loss import _group_size, check_loss_options
from .sigmoid_loss import siglip_loss

DIST_IMPLS = ("bidir", "shift", "reduce", "gather")


class SigLipLoss(nn.Module):
    """OpenCLIP's SigLipLoss interface over infcl_ds's exact tiled sigmoid loss.

    cache_labels, rank: accepted for compatibility (no labels are built; the rank comes from
    the process group). dist_impl: validated like OpenCLIP's; the result is the same for
    each (the ring over deepspeed.comm does the exchange). world_size: the data-parallel
    size whose averaging is compensated; it must match the process group.
    group and keyword options (backend, allow_tf32, ...): passed to infcl_ds.siglip_loss.
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
        check_loss_options(options, "infcl_ds.SigLipLoss", siglip_loss, TypeError)
        self.group = group
        self.options = options

    def forward(self, image_features, text_features, logit_scale, logit_bias, output_dict=False):
        size = _group_size(self.group)
        if size != self.world_size:
            raise ValueError(f"infcl_ds.SigLipLoss: world_size={self.world_size} but the process group has {size} ranks")
        image_features = scale_grad(image_features, size)
        text_features = scale_grad(text_features, size)
        loss = siglip_loss(image_features, text_features, logit_scale, logit_bias, self.group, **self.options)
        return {"contrastive_loss": loss} if output_dict else loss
