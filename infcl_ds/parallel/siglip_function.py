"""The exact global sigmoid (SigLIP) loss over the ranks of a group, as a ring of blocks; one
rank (a single device) is the ring of one.

Each rank keeps its image block; text blocks travel rank -> rank+1, and with each block its
fp32 partial text gradient, so that after W steps every block's gradient arrives home
complete. The sigmoid loss has no row or column statistics, so unlike the CLIP ring
(clip_function.py) one pass does everything: every step runs one block through the tile
sweep (ops/siglip_sweep.py), adding to this rank's image gradient and to the visiting block's
text gradient, and the loss and scale/bias partial sums (one all-reduce at the end). The
gradients are therefore computed in the forward, whenever an input needs one, and the
backward only multiplies them by the incoming gradient. The message order is
ClipLossFunction.backward's, for the same reason (NCCL's in-order, rendezvous P2P): per
step, batch A moves the next text block while the kernels run; batch C, after them, sends
this block's partial on and receives the next block's, which lands while the next step
computes.

Semantics: every rank returns the same global loss (sum over all global pairs / global
batch); each rank's feature gradients are the single-process gradients of its slice of the
global batch (local batches concatenated in group order, sizes may differ); the scale and
bias gradients are the full ones on every rank.
"""
from typing import List

import torch

from ..ops.options import KernelOptions
from ..ops.siglip_sweep import siglip_block
from .guards import refuse_double_backward
from .ring import ring_blocks

TAG_TEXT, TAG_GRAD = 0, 3


class SigLipLossFunction(torch.autograd.Function):
    """The sigmoid loss of the batch spread over ``ring``'s ranks: the one autograd Function
    of this loss. A single device is the ring of one rank (``LocalRing``): no block travels
    and the text gradient is written in place."""
    takes_bias = True

    @staticmethod
    def forward(ctx, image, text, scale, bias, options: KernelOptions, ring, sizes: List[int]):
        image, text = ring_blocks(image, text, ring)  # any layout in; a copy only where needed
        total = sum(sizes)
        s = scale.detach().reshape(1).float()
        b = bias.detach().reshape(1).float()
        need_grads = any(ctx.needs_input_grad[:4])
        # One host sync when gradients are wanted: the GEMMs take s/B as a plain float.
        coef = float(s[0]) / total if need_grads else 0.0
        grad_image = torch.zeros(image.shape, device=image.device, dtype=torch.float32) if need_grads else None
        if ring.size == 1:
            grad_text = torch.empty_like(text) if need_grads else None
            sums = siglip_block(image, text, s, b, coef, diag=True, grad_a=grad_image, grad_b=grad_text,
                                accumulate_b=False, options=options)
        else:
            sums, grad_text = _ring_sweep(image, text, s, b, coef, options, ring, sizes, grad_image)
        ring.all_reduce_sum(sums)
        if need_grads:
            ctx.save_for_backward(*_mean_loss_grads(grad_image, grad_text, sums, total, image, scale, bias))
        return (sums[0] / total).float()

    @staticmethod
    def backward(ctx, grad_loss):
        refuse_double_backward("sigmoid (SigLIP) loss")  # the saved gradients are constants to autograd
        # No transfer here: every gradient was completed in the forward. Saved tensors, not a
        # ctx attribute: autograd frees them after the backward, or keeps them under
        # retain_graph=True, and a second backward then returns the same gradients again.
        return (*_times(ctx.saved_tensors, grad_loss), None, None, None)


def _ring_sweep(image, text, s, b, coef, options, ring, sizes, grad_image):
    """W > 1 ranks: adds this rank's image gradient into ``grad_image`` (None: no gradients);
    returns (this rank's fp64 [3] partial sums, the local texts' gradient, home after its trip,
    in their dtype; None without gradients)."""
    dev, big, width = image.device, max(sizes), image.shape[1]
    need_grads = grad_image is not None
    # Two receive buffers for visiting blocks (the input itself is only ever sent).
    bufs = [torch.empty((big, width), device=dev, dtype=text.dtype) for _ in range(2)]
    if need_grads:
        # One fp32 partial in flight to rank+1 while the kernels fill the other; grad_in
        # receives the next block's partial (and, after the last step, this rank's own).
        contrib = [torch.empty((big, width), device=dev, dtype=torch.float32) for _ in range(2)]
        grad_in = torch.empty((big, width), device=dev, dtype=torch.float32)
    sums = torch.zeros(3, device=dev, dtype=torch.float64)
    partial_reqs = []
    for step in range(ring.size):
        q, i = ring.origin(step), step % 2
        last = step == ring.size - 1
        cur = text if step == 0 else bufs[i][:sizes[q]]
        # A. The next text block travels while this one is computed.
        text_reqs = [] if last else ring.start([cur], [bufs[1 - i][:sizes[ring.origin(step + 1)]]], TAG_TEXT)
        out = contrib[i][:sizes[q]] if need_grads else None
        sums += siglip_block(image, cur, s, b, coef, diag=(step == 0), grad_a=grad_image, grad_b=out,
                             accumulate_b=False, options=options)
        if need_grads:  # C. The travelling text gradient, one hop (Ring.relay_partial).
            partial_reqs = ring.relay_partial(out, grad_in, sizes, step, partial_reqs, TAG_GRAD)
        ring.wait(text_reqs, "text features", step)
    ring.wait(partial_reqs, "text gradient (home)", ring.size)
    if not need_grads:
        return sums, None
    del bufs, contrib, out, cur, partial_reqs  # freed before the gradient is cast
    return sums, grad_in[:sizes[ring.pos]].to(text.dtype)


def _mean_loss_grads(grad_image, grad_text, sums, n, image, scale, bias):
    """(d image, d text, d scale, d bias) of the mean loss over n pairs, in the inputs' dtypes
    and shapes."""
    grad_image_out = grad_image.to(image.dtype)
    grad_scale = (sums[1] / n).to(scale.dtype).reshape(scale.shape)
    grad_bias = (sums[2] / n).to(bias.dtype).reshape(bias.shape)
    return grad_image_out, grad_text, grad_scale, grad_bias


def _times(grads, grad_loss):
    """The saved gradients times the incoming one (no copy when it is exactly 1)."""
    if grad_loss.numel() == 1 and float(grad_loss) == 1.0:
        return grads
    return tuple(None if g is None else g * grad_loss.to(g.dtype) for g in grads)
