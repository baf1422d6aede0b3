"""The exact global CLIP loss over the ranks of a group, as a ring of blocks; one rank (a
single device) is the ring of one.

Each rank keeps its image block; text blocks travel rank -> rank+1. Every step runs one
block through the same kernels as the single-device loss (ops/block.py):

forward   row statistics of the local images accumulate in place; the column statistics of
          each text block travel with it (merged with log-add-exp) and, after one more hop,
          arrive home complete.
backward  each text block travels again with its complete column statistics and an fp32
          partial gradient; the block's G is recomputed once for both directions, giving
          this rank's image gradient and its contribution to the text block's gradient.

Overlap: the next text block is in flight while the kernels work on the current one, and
the travelling partial (column statistics, text gradient) of the next block arrives while
this block computes; only the last hop home is not hidden.

Semantics: every rank returns the same global loss; each rank's feature gradients equal the
single-process gradients of its slice of the global batch (the concatenation of the local
batches in group order); the logit-scale gradient is the full one on every rank (one
all-reduce). Local batch sizes may differ between ranks.
"""
from typing import List

import torch

from ..ops.block import block_backward, block_lse
from ..ops.positive_pairs import positive_logits_sum
from ..ops.options import KernelOptions
from .guards import refuse_double_backward
from .ring import ring_blocks

TAG_TEXT, TAG_COL_STATS, TAG_GRAD = 0, 2, 3


class ClipLossFunction(torch.autograd.Function):
    """The CLIP loss of the batch spread over ``ring``'s ranks: the one autograd Function of
    this loss. A single device is the ring of one rank (``LocalRing``): no block travels, the
    one block's statistics are complete at once, and its backward writes the text gradient
    in place; the loss, the saved state and the scale gradient are the same code for any W.

    Message order (W > 1): every rank posts the same sequence of batches, and within a batch
    its send to rank+1 is matched by rank+1's receive *in the same batch*. NCCL runs a rank's
    batches in order on one stream and a large send waits for its receive (rendezvous), so
    any other order (e.g. receiving the partial early, sending it later) deadlocks the ring
    once messages outgrow NCCL's eager buffers. Per step: batch A moves the next text block
    (overlapping the kernels); batch C, after the kernels, sends this block's partial on and
    receives the next block's partial, which lands while the next step computes."""
    takes_bias = False

    @staticmethod
    def forward(ctx, image, text, scale, options: KernelOptions, ring, sizes: List[int]):
        # Any layout in; the layout the kernels and the ring need, copied (if at all) once
        # here and saved for the backward.
        image, text = ring_blocks(image, text, ring)
        total = sum(sizes)
        s = scale.detach().reshape(1).float()
        kw = dict(backend=options.backend, allow_tf32=options.allow_tf32)
        if ring.size == 1:
            row, col_home = block_lse(image, text, s, **kw)
        else:
            row, col_home = _ring_statistics(image, text, s, kw, ring, sizes)
        local = ((row.double().sum() + col_home.double().sum()) / (2 * total)
                 - s[0].double() * positive_logits_sum(image, text) / total)
        loss = ring.all_reduce_sum(local).float()
        ctx.save_for_backward(image, text, s, row, col_home)
        ctx.options, ctx.ring, ctx.sizes = options, ring, sizes
        ctx.scale_shape, ctx.scale_dtype = scale.shape, scale.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        refuse_double_backward("contrastive loss")
        image, text, s, row, col_home = ctx.saved_tensors
        ring, sizes, opt = ctx.ring, ctx.sizes, ctx.options
        total = sum(sizes)
        # One host sync: the GEMMs take the factor g*s/(2B) as a plain float.
        coef = float(grad_loss * s[0]) / (2 * total)
        kw = dict(backend=opt.backend, allow_tf32=opt.allow_tf32, panel=opt.panel, rows=opt.panel_rows)
        grad_image = torch.zeros(image.shape, device=image.device, dtype=torch.float32)
        if ring.size == 1:
            grad_text = torch.empty_like(text)
            ds = block_backward(image, text, s, row, col_home, coef, diag=True, grad_a=grad_image,
                                grad_b=grad_text, accumulate_b=False, **kw)
        else:
            grad_text, ds = _ring_gradients(image, text, s, row, col_home, coef, kw, ring, sizes, grad_image)
        ring.all_reduce_sum(ds)
        grad_scale = (grad_loss.double() * ds / (2 * total)).to(ctx.scale_dtype).reshape(ctx.scale_shape)
        grad_image_out = grad_image.to(image.dtype)
        del grad_image
        return grad_image_out, grad_text.to(text.dtype), grad_scale, None, None, None


def _ring_statistics(image, text, s, kw, ring, sizes):
    """Forward over W > 1 ranks: (row log-sum-exps of the local images, column log-sum-exps of
    the local texts, complete after their block's trip round the ring)."""
    dev = image.device
    # Two receive buffers for visiting blocks (the input itself is only ever sent).
    bufs = [torch.empty((max(sizes), image.shape[1]), device=dev, dtype=text.dtype) for _ in range(2)]
    row = torch.full((image.shape[0],), float("-inf"), device=dev, dtype=torch.float32)
    col_in = torch.empty(max(sizes), device=dev, dtype=torch.float32)
    col_home = torch.empty(sizes[ring.pos], device=dev, dtype=torch.float32)
    partial_reqs = []
    for step in range(ring.size):
        q = ring.origin(step)
        last = step == ring.size - 1
        cur = text if step == 0 else bufs[step % 2][:sizes[q]]
        # A. The next text block travels while this one is computed.
        text_reqs = [] if last else ring.start([cur], [bufs[(step + 1) % 2][:sizes[ring.origin(step + 1)]]], TAG_TEXT)
        # This block's contribution to the row and column statistics.
        row_part, col_part = block_lse(image, cur, s, **kw)
        row = torch.logaddexp(row, row_part)
        ring.wait(partial_reqs, "column statistics", step)  # batch C of the last step
        col_out = col_part if step == 0 else torch.logaddexp(col_in[:sizes[q]], col_part)
        # C. Merged statistics on to rank+1 (home after the last step); the next
        #    block's arrive from rank-1.
        target = col_home if last else col_in[:sizes[ring.origin(step + 1)]]
        partial_reqs = ring.start([col_out], [target], TAG_COL_STATS)
        ring.wait(text_reqs, "text features", step)
    ring.wait(partial_reqs, "column statistics (home)", ring.size)
    return row, col_home


def _ring_gradients(image, text, s, row, col_home, coef, kw, ring, sizes, grad_image):
    """Backward over W > 1 ranks: adds this rank's image gradient into ``grad_image``; returns
    (the local texts' fp32 gradient, home after its trip, this rank's part of d loss / d s)."""
    width, dev, big = image.shape[1], image.device, max(sizes)
    bufs = [torch.empty((big, width), device=dev, dtype=text.dtype) for _ in range(2)]
    col_bufs = [torch.empty(big, device=dev, dtype=torch.float32) for _ in range(2)]
    # fp32 partial text gradients: one buffer in flight to rank+1 while the kernels fill
    # the other, and one receiving the next block's partial from rank-1 (it arrives while
    # the next block computes; the own block's complete gradient comes home into it).
    # Per local sample with the features: 4 D (bf16 blocks) + 12 D (partials) + 4 D
    # (image gradient) + the features' 4 D = 24 D bytes; the G tile is a constant.
    contrib = [torch.empty((big, width), device=dev, dtype=torch.float32) for _ in range(2)]
    grad_in = torch.empty((big, width), device=dev, dtype=torch.float32)
    ds = torch.zeros((), device=dev, dtype=torch.float64)
    partial_reqs = []
    for step in range(ring.size):
        q, i = ring.origin(step), step % 2
        last = step == ring.size - 1
        cur = text if step == 0 else bufs[i][:sizes[q]]
        cur_col = col_home if step == 0 else col_bufs[i][:sizes[q]]
        # A. The next block and its complete column statistics travel meanwhile.
        text_reqs = []
        if not last:
            n = sizes[ring.origin(step + 1)]
            text_reqs = ring.start([cur, cur_col], [bufs[1 - i][:n], col_bufs[1 - i][:n]], TAG_TEXT)
        # One recomputation of each tile: this rank's image gradient and its share of
        # the visiting block's text gradient (contrib[i] was sent two steps ago and
        # that batch was waited for in the last step).
        out = contrib[i][:sizes[q]]
        ds += block_backward(image, cur, s, row, cur_col, coef, diag=(step == 0), grad_a=grad_image,
                             grad_b=out, accumulate_b=False, **kw)
        # C. Add the partial that travelled here and pass the sum on to rank+1 (home
        #    after the last step) while the next step computes.
        partial_reqs = ring.relay_partial(out, grad_in, sizes, step, partial_reqs, TAG_GRAD)
        ring.wait(text_reqs, "text features", step)
    ring.wait(partial_reqs, "text gradient (home)", ring.size)
    return grad_in[:sizes[ring.pos]], ds
