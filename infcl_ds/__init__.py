"""infcl_ds: exact contrastive loss at batch sizes of millions (Inf-CL) on DeepSpeed."""
__version__ = "0.1.0"

from .loss import ContrastiveLoss, contrastive_loss  # noqa: E402
from .clip_loss import ClipLoss  # noqa: E402
from .sigmoid_loss import SigmoidLoss, siglip_loss  # noqa: E402
from .siglip_dropin import SigLipLoss  # noqa: E402  (not "siglip_loss": that name is the function)

__all__ = ["ClipLoss", "ContrastiveLoss", "SigLipLoss", "SigmoidLoss", "contrastive_loss", "siglip_loss", "__version__"]
