"""Chunk gradients summed in fp32 when the model is bf16.

Inside ``coalesce_grad_reduction`` DeepSpeed leaves each chunk's gradient on ``param.grad``,
where autograd adds it in the parameter's dtype. In bf16 (8 bits of mantissa) a sum over
hundreds of chunks drops the late chunks' contributions. This folds ``param.grad`` into an
fp32 sum after every chunk and hands DeepSpeed the sum, rounded once, before the last
chunk's backward (which is where ZeRO 0 reduces; ZeRO 1/2 reduce when the coalesced block
exits). Memory: 4 bytes per parameter on every rank, not sharded.
"""
from typing import Dict, Iterable

import torch


class Fp32GradSum:
    def __init__(self, params: Iterable[torch.nn.Parameter]):
        self.params = [p for p in params if p.requires_grad]
        self.sums: Dict[int, torch.Tensor] = {}

    def fold(self) -> None:
        """Move every parameter's gradient into its fp32 sum."""
        for p in self.params:
            if p.grad is None:
                continue
            total = self.sums.get(id(p))
            if total is None:
                self.sums[id(p)] = p.grad.float()
            else:
                total.add_(p.grad)
            p.grad = None

    def restore(self) -> None:
        """Put the sums back on ``param.grad`` in the parameter's dtype; the next backward adds to them."""
        for p in self.params:
            total = self.sums.pop(id(p), None)
            if total is not None:
                p.grad = total.to(p.dtype)
        self.sums.clear()
