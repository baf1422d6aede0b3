"""infcl_ds: exact contrastive loss at batch sizes of millions (Inf-CL) on DeepSpeed.

Deprecated name: ``siglip_loss``, the former name of ``sigmoid_loss`` (the same function), kept
for existing callers without a warning; use ``sigmoid_loss``."""
__version__ = "0.1.0"

from .losses import ClipLoss, ContrastiveLoss, SigLipLoss, SigmoidLoss, contrastive_loss, sigmoid_loss  # noqa: E402

siglip_loss = sigmoid_loss  # deprecated: the function's former name, kept for existing callers

__all__ = ["ClipLoss", "ContrastiveLoss", "SigLipLoss", "SigmoidLoss", "contrastive_loss", "sigmoid_loss", "__version__"]
