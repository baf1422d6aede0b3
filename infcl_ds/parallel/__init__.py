"""Cross-rank level of the tiling: one autograd Function per loss over a ring (deepspeed.comm
or torch.distributed; one device is the ring of one). Imports ops, never losses/engine."""
from .checks import check_across_ranks
from .clip_function import ClipLossFunction
from .ring import LocalRing, Ring, group_size
from .siglip_function import SigLipLossFunction

__all__ = ["ClipLossFunction", "LocalRing", "Ring", "SigLipLossFunction", "check_across_ranks", "group_size"]
