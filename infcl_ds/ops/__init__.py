"""Kernels and the single-device loss Function (the lowest layer: imports nothing above)."""
from .block import block_backward, block_lse
from .clip import KernelOptions, TiledClipLoss
from .siglip import SigLipOptions, TiledSigLipLoss

__all__ = ["KernelOptions", "SigLipOptions", "TiledClipLoss", "TiledSigLipLoss", "block_backward", "block_lse"]
