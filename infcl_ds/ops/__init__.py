"""Kernels and their launchers (the lowest layer: imports nothing above; no autograd Function)."""
from .block import block_backward, block_lse
from .options import KernelOptions
from .siglip_sweep import siglip_block

__all__ = ["KernelOptions", "block_backward", "block_lse", "siglip_block"]
