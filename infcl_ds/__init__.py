"""infcl_ds: exact contrastive loss at batch sizes of millions (Inf-CL) on DeepSpeed."""
__version__ = "0.1.0"

from .losses import ClipLoss, ContrastiveLoss, SigLipLoss, SigmoidLoss, contrastive_loss, sigmoid_loss  # noqa: E402

siglip_loss = sigmoid_loss  # the function's former name, kept for existing callers

__all__ = ["ClipLoss", "ContrastiveLoss", "SigLipLoss", "SigmoidLoss", "contrastive_loss", "sigmoid_loss", "__version__"]
