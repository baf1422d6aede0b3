"""The exact global sigmoid (SigLIP) loss over the ranks of a group, as a ring of blocks.

Each rank keeps its image block; text blocks travel rank -> rank+1, and with each block its
fp32 partial text gradient, so that after W steps every block's gradient arrives home
complete. The sigmoid loss has no row or column statistics, so unlike the CLIP ring
(ring_loss.py) one pass does everything: every step runs one block through the same sweep
as the single-device loss (ops/siglip.py), adding to this rank's image gradient and to the
visiting block's text gradient, and the loss and scale/bias partial sums (one all-reduce at
the end). The message order is ClipLossFunction.backward's, for the same reason (NCCL's
in-order, rendezvous P2P): per step, batch A moves the next text block while the kernels
run; batch C, after them, sends this block's partial on and receives the next block's,
which lands while the next step computes.

Semantics: every rank returns the same global loss (sum over all global pairs / global
batch); each rank's feature gradients are the single-process gradients of its slice of the
global batch (local batches concatenated in group order, sizes may differ); the scale and
bias gradients are the full ones on every rank.
"""
from typing import List

import torch

from ..ops.siglip import SigLipOptions, finish_grads, keep_grads, kept_grads, siglip_block
from .ring import Ring

TAG_TEXT, TAG_GRAD = 0, 3


class RingSigLipLoss(torch.autograd.Function):

    @staticmethod
    def forward(ctx, image, text, scale, bias, options: SigLipOptions, ring: Ring, sizes: List[int]):
        total, dev, big, width = sum(sizes), image.device, max(sizes), image.shape[1]
        s = scale.detach().reshape(1).float()
        b = bias.detach().reshape(1).float()
        need_grads = any(ctx.needs_input_grad[:4])
        coef = float(s[0]) / total if need_grads else 0.0
        # Two receive buffers for visiting blocks (the input itself is only ever sent).
        bufs = [torch.empty((big, width), device=dev, dtype=text.dtype) for _ in range(2)]
        if need_grads:
            # One fp32 partial in flight to rank+1 while the kernels fill the other; grad_in
            # receives the next block's partial (and, after the last step, this rank's own).
            contrib = [torch.empty((big, width), device=dev, dtype=torch.float32) for _ in range(2)]
            grad_in = torch.empty((big, width), device=dev, dtype=torch.float32)
            grad_image = torch.zeros(image.shape, device=dev, dtype=torch.float32)
        sums = torch.zeros(3, device=dev, dtype=torch.float64)
        partial_reqs = []
        for step in range(ring.size):
            q, i = ring.origin(step), step % 2
            last = step == ring.size - 1
            cur = text if step == 0 else bufs[i][:sizes[q]]
            # A. The next text block travels while this one is computed.
            text_reqs = [] if last else ring.start([cur], [bufs[1 - i][:sizes[ring.origin(step + 1)]]], TAG_TEXT)
            out = contrib[i][:sizes[q]] if need_grads else None
            sums += siglip_block(image, cur, s, b, coef, diag=(step == 0), grad_a=grad_image if need_grads else None,
                                 grad_b=out, accumulate_b=False, options=options)
            if need_grads:  # C. The travelling text gradient, one hop (Ring.relay_partial).
                partial_reqs = ring.relay_partial(out, grad_in, sizes, step, partial_reqs, TAG_GRAD)
            ring.wait(text_reqs, "text features", step)
        ring.wait(partial_reqs, "text gradient (home)", ring.size)
        ring.all_reduce_sum(sums)
        if need_grads:
            del bufs, contrib, out, cur, partial_reqs  # freed before the outputs are cast
            grad_text = grad_in[:sizes[ring.pos]].to(text.dtype)
            del grad_in
            keep_grads(ctx, finish_grads(grad_image, grad_text, sums, total, image, scale, bias))
        return (sums[0] / total).float()

    @staticmethod
    def backward(ctx, grad_loss):
        # No transfer here: every gradient was completed in the forward.
        return (*kept_grads(ctx, grad_loss), None, None, None)
