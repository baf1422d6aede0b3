"""Kernels and the single-device loss Function (the lowest layer: imports nothing above)."""
from .block import block_backward, block_lse
from .clip import KernelOptions, TiledClipLoss

__all__ = ["KernelOptions", "TiledClipLoss", "block_backward", "block_lse"]
