"""Cross-rank level of the tiling: a ring over deepspeed.comm or torch.distributed (imports ops, never loss/engine)."""
from .ring import Ring
from .ring_loss import RingClipLoss
from .siglip_ring import RingSigLipLoss
from .checks import check_across_ranks

__all__ = ["Ring", "RingClipLoss", "RingSigLipLoss", "check_across_ranks"]
