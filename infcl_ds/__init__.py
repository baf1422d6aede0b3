"""infcl_ds: exact contrastive loss at batch sizes of millions (Inf-CL) on DeepSpeed."""
__version__ = "0.1.0"

from .loss import ContrastiveLoss, contrastive_loss  # noqa: E402
from .clip_loss import ClipLoss  # noqa: E402

__all__ = ["ClipLoss", "ContrastiveLoss", "contrastive_loss", "__version__"]
