"""Kernels and the single-device SigLIP Function (the lowest layer: imports nothing above)."""
from .block import block_backward, block_lse
from .clip import KernelOptions
from .siglip import SigLipOptions, TiledSigLipLoss

__all__ = ["KernelOptions", "SigLipOptions", "TiledSigLipLoss", "block_backward", "block_lse"]
