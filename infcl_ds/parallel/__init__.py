"""Cross-rank level of the tiling: a ring over deepspeed.comm or torch.distributed (imports ops, never loss/engine)."""
from .ring import LocalRing, Ring
from .ring_loss import ClipLossFunction
from .siglip_ring import RingSigLipLoss
from .checks import check_across_ranks

__all__ = ["ClipLossFunction", "LocalRing", "Ring", "RingSigLipLoss", "check_across_ranks"]
