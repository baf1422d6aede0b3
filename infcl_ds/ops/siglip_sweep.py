"""The sigmoid (SigLIP) loss: one sweep over the tiles gives the loss and every gradient.

For a batch of B pairs, S = s * A @ B^T + b (logit scale s, logit bias b),

    L = (1/B) * sum_ij softplus(-z_ij * S_ij),   z_ij = +1 if i pairs with j, else -1,

i.e. -log sigmoid(z * S) summed over all pairs. Unlike the softmax CLIP loss there is no
normalisation across a row or column, so a tile needs nothing but itself: its derivative

    G_ij = dL/dS_ij * B = -z_ij * sigmoid(-z_ij * S_ij)

is known as soon as the tile's similarities are, and the loss, dA = (s/B) G @ B,
dB = (s/B) G^T @ A, ds = (1/B) sum G * (A@B^T) and db = (1/B) sum G all come from one pass.
The autograd Function (parallel/siglip_function.py) therefore computes the gradients in its
forward (when any input needs one) and the backward only multiplies them by the incoming
gradient, as Liger-Kernel does for its fused cross-entropy.

Why a G tile and two cuBLAS GEMMs (ops/g_tiles.py's walk_g_tiles), not a FlashAttention-2
style backward (a program per column block accumulating dB_j in registers, atomics for dA):
contrastive features are 768-1152 wide, so a [128, D] fp32 accumulator is 400-600 KB, far
beyond a Hopper SM's registers and shared memory, and splitting D would recompute each
tile D/128 times. Atomically adding dA/dB partials to global memory instead moves
~2 x 128 x D x 4 bytes per 128 x 128 tile, which the L2 atomics cannot keep up with at the
tensor cores' rate. The kernel here does 2 B^2 D of the 6 B^2 D flops (the similarity
tile, K loop over D on the tensor cores, fp32 accumulation) plus the element-wise math,
and writes G once in the features' dtype; the other 4 B^2 D run in two dense GEMMs at
cuBLAS speed, G panels keeping the extra memory O(B * D).

Element-wise math (fp32, exp2/log2, one exponential per element): with u = z * S and
e = 2^(-|u| log2 e) in (0, 1], softplus(-u) = max(-u, 0) + log1p(e) and
sigmoid(-u) = (e if u >= 0 else 1) / (1 + e): stable for any |S|. log1p(e) takes a short
series for e < 1/16, where log2(1 + e) would lose the digits of e to the rounding of 1 + e
(every negative pair of a trained model has e ~ 1e-5).
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from .g_tiles import walk_g_tiles
from .layout import as_row_major, check_row_major
from .options import KernelOptions, resolve_backend
from .tiles import similarity_tile
from .tuning import TUNE_ROWS, TileConfig, interpreting, pick_config


@triton.jit
def _siglip_tile_kernel(
    A, B, SCALE, BIAS, G, PART,
    n_a, n_b, D, stride_a, stride_b, stride_g, diag_offset,
    HAS_DIAG: tl.constexpr, WRITE_G: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """One tile of S = s * A @ B^T + b: its loss, G = -z * sigmoid(-z * S), and partial sums.

    A [n_a, D], B [n_b, D]: any row strides, last stride 1. SCALE, BIAS: pointers to fp32 s
      and b (read on device).
    HAS_DIAG: row i pairs with column i - diag_offset (z = +1 there), else every z = -1.
    WRITE_G: store G into G [n_a, n_b] (row stride stride_g, last stride 1) in G's dtype.
    PART [programs, 3]: this program's fp32 sums of the loss terms, G * (A_i . B_j) and G.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    s = tl.load(SCALE).to(tl.float32)
    bias = tl.load(BIAS).to(tl.float32)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = offs_m < n_a
    col_ok = offs_n < n_b
    valid = row_ok[:, None] & col_ok[None, :]
    x = similarity_tile(A, B, offs_m, offs_n, D, stride_a, stride_b, row_ok, col_ok,
                        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST, INPUT_PRECISION)
    logits = x * s + bias
    if HAS_DIAG:
        positive = offs_m[:, None] == offs_n[None, :] + diag_offset
    else:
        positive = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int1)
    u = tl.where(positive, logits, -logits)
    e = tl.exp2(tl.abs(u) * -1.4426950408889634)
    # log1p(e): series below 1/16 (truncation < e^7/7, 1e-8 relative), log2 above.
    series = e * (1.0 - e * (0.5 - e * (0.3333333333333333 - e * (0.25 - e * (0.2 - e * 0.16666666666666666)))))
    log1p_e = tl.where(e < 0.0625, series, tl.log2(1.0 + e) * 0.6931471805599453)
    loss = tl.where(valid, tl.maximum(-u, 0.0) + log1p_e, 0.0)
    sig = tl.fdiv(tl.where(u >= 0, e, 1.0), 1.0 + e)  # sigmoid(-u)
    g = tl.where(valid, tl.where(positive, -sig, sig), 0.0)
    pid = pid_m * tl.num_programs(1) + pid_n
    tl.store(PART + pid * 3, tl.sum(tl.sum(loss, 1), 0))
    tl.store(PART + pid * 3 + 1, tl.sum(tl.sum(g * x, 1), 0))
    tl.store(PART + pid * 3 + 2, tl.sum(tl.sum(g, 1), 0))
    if WRITE_G:
        g_ptrs = G + offs_m.to(tl.int64)[:, None] * stride_g + offs_n[None, :]
        tl.store(g_ptrs, g.to(G.dtype.element_ty), mask=valid)


def _launch(a, b, scale, bias, out, diag_offset, cfg: TileConfig, input_precision, write_g):
    n_a, D = a.shape
    n_b = b.shape[0]
    grid = (triton.cdiv(n_a, cfg.block_m), triton.cdiv(n_b, cfg.block_n))
    part = torch.empty((grid[0] * grid[1], 3), device=a.device, dtype=torch.float32)
    _siglip_tile_kernel[grid](
        a, b, scale, bias, out, part,
        n_a, n_b, D, a.stride(0), b.stride(0), out.stride(0) if write_g else 0,
        0 if diag_offset is None else diag_offset,
        HAS_DIAG=diag_offset is not None, WRITE_G=write_g,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_K=D % cfg.block_k == 0, UPCAST=interpreting(), INPUT_PRECISION=input_precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return part.sum(0, dtype=torch.float64)


def triton_tile(a, b, scale, bias, out, diag_offset, input_precision="tf32", write_g=True):
    """G of ``a`` against the panel ``b`` into ``out`` (if write_g); returns the fp64 [3]
    sums (loss terms, G * a@b.T, G). scale, bias: 1-element fp32 tensors on a's device.

    a, b: any strides (one that is not row-major is copied: ops/layout.py; siglip_block
    copies a block once, before slicing it into panels). out: written in place, so it must
    be row-major (ValueError otherwise)."""
    a, b = as_row_major(a), as_row_major(b)
    if write_g:
        check_row_major(out, "triton_tile's out")

    def time_config(cfg):
        n = min(TUNE_ROWS, a.shape[0])
        return triton.testing.do_bench(
            lambda: _launch(a[:n], b, scale, bias, out[:n] if write_g else out, diag_offset, cfg,
                            input_precision, write_g),
            warmup=5, rep=20, return_mode="median")

    kind = "siglip" if write_g else "siglip_loss_only"
    cfg = pick_config(kind, a.shape[1], a.dtype, input_precision, a.device, time_config, a.shape[0])
    return _launch(a, b, scale, bias, out, diag_offset, cfg, input_precision, write_g)


def torch_tile(a, b, scale, bias, out, diag_offset, write_g=True):
    """The CPU path of triton_tile, same contract; three fp32 [rows, panel] temporaries."""
    x = a.float() @ b.float().T
    logits = x * scale + bias
    rows = cols = None
    if diag_offset is not None:
        cols = torch.arange(b.shape[0], device=a.device)
        keep = (cols + diag_offset >= 0) & (cols + diag_offset < a.shape[0])
        cols = cols[keep]
        rows = cols + diag_offset
    # -z * S: the loss term is softplus of it and G = -z * sigmoid of it.
    neg_zs = logits
    if rows is not None:
        neg_zs[rows, cols] = -neg_zs[rows, cols]
    loss_sum = torch.nn.functional.softplus(neg_zs).sum(dtype=torch.float64)
    g = out if write_g else neg_zs
    torch.sigmoid(neg_zs, out=g)
    if rows is not None:
        g[rows, cols] = -g[rows, cols]
    return torch.stack([loss_sum, (g * x).sum(dtype=torch.float64), g.sum(dtype=torch.float64)])


def siglip_block(a, b, scale, bias, coef: float, *, diag: bool, grad_a: Optional[torch.Tensor],
                 grad_b: Optional[torch.Tensor], accumulate_b: bool, options: KernelOptions) -> torch.Tensor:
    """One block ``a`` (rows) against ``b`` (columns) of the sigmoid loss.

    Returns the fp64 [3] sums over the block: loss terms, G * (a @ b.T), G. With grad_a
    (fp32 [n_a, D], accumulated) and grad_b ([n_b, D]; written, or added if accumulate_b)
    also adds coef * G @ b and coef * G^T @ a to them; both None computes the sums only.
    diag: a and b come from the same rank (positives on the block's diagonal).
    a, b: any strides; one that is not row-major is copied here, once per block, rather
    than by each G tile's kernel or GEMM (ops/layout.py).
    """
    a, b = as_row_major(a), as_row_major(b)
    backend = resolve_backend(options.backend, a.device)
    precision = "tf32" if options.allow_tf32 else "ieee"
    write_g = grad_a is not None

    def fill(g, a_rows, b_panel, i0, j0, offset):
        if backend == "triton":
            return triton_tile(a_rows, b_panel, scale, bias, g, offset, precision, write_g)
        return torch_tile(a_rows, b_panel, scale, bias, g, offset, write_g)

    total = torch.zeros(3, device=a.device, dtype=torch.float64)
    return walk_g_tiles(a, b, fill, total, coef, diag=diag, grad_a=grad_a, grad_b=grad_b,
                              accumulate_b=accumulate_b, backend=backend, allow_tf32=options.allow_tf32,
                              panel=options.panel, rows=options.panel_rows)

