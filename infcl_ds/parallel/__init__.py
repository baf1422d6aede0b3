"""Cross-rank level of the tiling: a ring over deepspeed.comm (imports ops, never loss/engine)."""
from .ring import Ring, ensure_deepspeed_comm
from .ring_loss import RingClipLoss
from .siglip_ring import RingSigLipLoss
from .checks import check_across_ranks

__all__ = ["Ring", "RingClipLoss", "RingSigLipLoss", "check_across_ranks", "ensure_deepspeed_comm"]
